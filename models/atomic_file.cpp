// atomic_file.cpp: temporary file, fsync, rename, fsync of the folder.
#include "models/atomic_file.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <sys/stat.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace dist::models {

std::string write_file_atomically(const std::string& path,
                                  const std::vector<std::string_view>& parts) {
    fs::path target(path);
    fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
    std::string tmpl = (dir / ("." + target.filename().string() + ".tmp-XXXXXX")).string();
    std::vector<char> name(tmpl.begin(), tmpl.end());
    name.push_back('\0');
    int fd = ::mkstemp(name.data());
    if (fd < 0)
        return "`" + path + "`: cannot create a temporary file in `" + dir.string() +
               "`: " + std::strerror(errno);
    auto fail = [&](const char* what, bool open) {
        std::string e = "`" + path + "`: " + what + ": " + std::strerror(errno);
        if (open) ::close(fd);
        ::unlink(name.data());
        return e;
    };
    struct stat st {};
    mode_t mode;
    if (::stat(path.c_str(), &st) == 0) {
        mode = st.st_mode & 07777;
    } else {
        mode_t mask = ::umask(0);
        ::umask(mask);
        mode = 0666 & ~mask;
    }
    if (::fchmod(fd, mode) != 0) return fail("cannot set permissions", true);
    for (std::string_view part : parts) {
        size_t done = 0;
        while (done < part.size()) {
            ssize_t n = ::write(fd, part.data() + done, part.size() - done);
            if (n < 0) {
                if (errno == EINTR) continue;
                return fail("cannot write", true);
            }
            done += static_cast<size_t>(n);
        }
    }
    if (::fsync(fd) != 0) return fail("cannot fsync", true);
    if (::close(fd) != 0) return fail("cannot close", false);
    if (::rename(name.data(), path.c_str()) != 0) return fail("cannot replace the file", false);
    // Without this the rename itself may not survive a crash.
    int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
    return {};
}

} // namespace dist::models
