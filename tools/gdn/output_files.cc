// output_files.cc: see output_files.h.
#include "output_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

namespace gdn::cli {
namespace {

std::string cause() { return std::strerror(errno); }

// The file was not written: what failed, and that no output changed.
[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what) {
  throw OutputError(path.string() + ": " + what + "; no output file was changed");
}

void write_all(int fd, const std::filesystem::path& path, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(path, "write failed (" + (n < 0 ? cause() : std::string("no progress")) + ")");
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
}

}  // namespace

void make_output_directory(const std::filesystem::path& dir) {
  std::error_code error;
  if (std::filesystem::is_directory(dir, error)) return;
  if (std::filesystem::exists(dir, error)) {
    throw OutputError("option '--out': expected a directory (made if missing), given '" +
                      dir.string() + "', which is not one; no output file was changed");
  }
  std::filesystem::create_directories(dir, error);
  if (error) {
    throw OutputError("option '--out': cannot make the directory '" + dir.string() + "' (" +
                      error.message() + "); no output file was changed");
  }
}

OutputFiles::~OutputFiles() {
  for (const Staged& s : staged_) ::unlink(s.temp.c_str());
}

void OutputFiles::write(const std::filesystem::path& path,
                        std::initializer_list<std::string_view> parts) {
  if (path.filename().empty() || path.filename() == "." || path.filename() == "..") {
    fail(path, "not a file name");
  }
  // A link is written through (the rename replaces the file it names, not the link); a dangling
  // one names a file to make.
  std::filesystem::path target = path;
  std::error_code error;
  if (std::filesystem::is_symlink(path, error)) {
    target = std::filesystem::weakly_canonical(path, error);
    if (error) fail(path, "cannot follow its symbolic link (" + error.message() + ")");
  }
  const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : ".";
  const std::string name = target.filename().string();
  // A rename over a directory fails: refused here, before any file is written or renamed.
  struct stat existing {};
  const bool exists = ::stat(target.c_str(), &existing) == 0;
  if (exists && S_ISDIR(existing.st_mode)) fail(path, "is a directory");
  int fd = -1;
  std::filesystem::path temp;
  for (int attempt = 0; fd < 0; ++attempt) {
    temp = dir / ("." + name + "." + std::to_string(::getpid()) + "." +
                  std::to_string(staged_.size()) + "." + std::to_string(attempt) + ".tmp");
    fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && (errno != EEXIST || attempt == 100)) {
      fail(path, "cannot create a temporary file in " + dir.string() + " (" + cause() + ")");
    }
  }
  // Registered at once, so that any failure below removes it.
  staged_.push_back({path, target, temp});
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) ::close(fd);
    }
  } closer{fd};
  if (exists && S_ISREG(existing.st_mode)) ::fchmod(fd, existing.st_mode & 07777);
  for (std::string_view part : parts) write_all(fd, path, part);
  if (::fsync(fd) != 0 && errno != EINVAL) fail(path, "cannot flush to disk (" + cause() + ")");
  closer.fd = -1;
  if (::close(fd) != 0) fail(path, "write failed on close (" + cause() + ")");
}

void OutputFiles::commit() {
  std::set<std::filesystem::path> dirs;
  for (std::size_t i = 0; i < staged_.size(); ++i) {
    const Staged& s = staged_[i];
    if (::rename(s.temp.c_str(), s.target.c_str()) != 0) {
      const std::string why = cause();
      std::string done;
      for (std::size_t j = 0; j < i; ++j) {
        done += (done.empty() ? "" : ", ") + staged_[j].path.filename().string();
      }
      staged_.erase(staged_.begin(), staged_.begin() + static_cast<std::ptrdiff_t>(i));
      throw OutputError(
          s.path.string() + ": cannot rename the complete temporary file over it (" + why + "); " +
          (done.empty() ? "no output file was changed"
                        : "already replaced: " + done + "; the others are as before"));
    }
    dirs.insert(s.target.has_parent_path() ? s.target.parent_path() : ".");
  }
  staged_.clear();
  // The renames themselves to disk (best effort: not every file system syncs a directory).
  for (const std::filesystem::path& dir : dirs) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
      ::fsync(fd);
      ::close(fd);
    }
  }
}

}  // namespace gdn::cli
