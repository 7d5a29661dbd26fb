#pragma once
/// \file
/// A read-only view of a whole file's bytes: memory-mapped when opened from a path (model files are
/// hundreds of MB to tens of GB, and weights are read in place), or an owned buffer (tests, fuzzing).
/// Readers parse `bytes()` with bounds checks of their own; this class only guarantees the span is valid
/// for its lifetime. Move-only.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "infer/core/error.hpp"

namespace infer::io {

class MappedFile {
 public:
  /// Maps `path` read-only. IoError names the path and the OS's reason.
  static MappedFile open(const std::filesystem::path& path) {
    MappedFile f;
    f.path_ = path.string();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw IoError(detail::cat("cannot open '", f.path_, "': ", std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      const int err = errno;
      ::close(fd);
      throw IoError(detail::cat("'", f.path_, "' is not a regular file",
                                err ? detail::cat(": ", std::strerror(err)) : std::string()));
    }
    f.size_ = static_cast<std::size_t>(st.st_size);
    if (f.size_ > 0) {
      void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        throw IoError(detail::cat("cannot map '", f.path_, "' (", f.size_, " bytes): ", std::strerror(err)));
      }
      f.map_ = p;
      f.data_ = static_cast<const std::byte*>(p);
    }
    ::close(fd);  // the mapping keeps the file alive
    return f;
  }

  /// Wraps an owned buffer, with `name` standing in for the path in error messages.
  static MappedFile from_bytes(std::vector<std::byte> bytes, std::string name = "<memory>") {
    MappedFile f;
    f.owned_ = std::move(bytes);
    f.data_ = f.owned_.data();
    f.size_ = f.owned_.size();
    f.path_ = std::move(name);
    return f;
  }

  MappedFile(MappedFile&& o) noexcept { *this = std::move(o); }
  MappedFile& operator=(MappedFile&& o) noexcept {
    if (this != &o) {
      release();
      map_ = std::exchange(o.map_, nullptr);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      path_ = std::move(o.path_);
      const bool owned = !o.owned_.empty();
      owned_ = std::move(o.owned_);
      if (owned) data_ = owned_.data();  // vector move keeps the buffer; re-point for clarity
    }
    return *this;
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() { release(); }

  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  MappedFile() = default;
  void release() noexcept {
    if (map_) ::munmap(map_, size_);
    map_ = nullptr;
  }

  void* map_ = nullptr;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::vector<std::byte> owned_;
  std::string path_;
};

}  // namespace infer::io
