// output_files.h: the files a command writes, all of them or none. Each is written to a new
// temporary file in its own directory, flushed to disk, and renamed over its name by commit()
// once every file of the command is complete; a rename within a directory replaces the old
// file at once, so a reader (the next step reading --in = --out) finds the old file or the new
// one, never a part. If anything fails before commit (a full disk, a file size limit, a
// directory that cannot be written), the temporary files are removed and every file that
// existed is as it was.
#pragma once

#include <filesystem>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace gdn::cli {

class OutputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Makes the --out directory `dir` (with its parents) if it is missing. Throws OutputError naming
// --out when `dir` is something else (a regular file) or cannot be made.
void make_output_directory(const std::filesystem::path& dir);

class OutputFiles {
 public:
  OutputFiles() = default;
  OutputFiles(const OutputFiles&) = delete;
  OutputFiles& operator=(const OutputFiles&) = delete;
  // Removes the temporary files of a batch that was not committed (an error on the way).
  ~OutputFiles();

  // Writes `parts` back to back into a temporary file beside `path` (".NAME.<pid>.<n>.tmp",
  // the mode of an existing regular file at `path`, else the umask's). Throws OutputError
  // naming `path` and the cause.
  void write(const std::filesystem::path& path, std::initializer_list<std::string_view> parts);

  // Renames every temporary file over its path, in the order written. Throws OutputError if a
  // rename fails (then the files renamed before it are the new ones, and it says which).
  void commit();

 private:
  struct Staged {
    std::filesystem::path path, target, temp;  // target: path, or the file its link names
  };
  std::vector<Staged> staged_;
};

}  // namespace gdn::cli
