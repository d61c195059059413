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

OutputFiles::~OutputFiles() {
  for (const Staged& s : staged_) ::unlink(s.temp.c_str());
}

void OutputFiles::write(const std::filesystem::path& path,
                        std::initializer_list<std::string_view> parts) {
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : ".";
  const std::string name = path.filename().string();
  if (name.empty() || name == "." || name == "..") fail(path, "not a file name");
  // A rename over a directory fails: refused here, before any file is written or renamed.
  struct stat existing {};
  const bool exists = ::stat(path.c_str(), &existing) == 0;
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
  staged_.push_back({path, temp});
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
    if (::rename(s.temp.c_str(), s.path.c_str()) != 0) {
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
    dirs.insert(s.path.has_parent_path() ? s.path.parent_path() : ".");
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
