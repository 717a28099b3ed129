// launch.cpp: reading Slurm's, OpenMPI's and Dist's launch variables.
#include "transport/launch.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <random>

namespace dist::transport {

namespace {

bool parse_int(const std::string& s, int& out) {
    if (s.empty()) return false;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc() && end == s.data() + s.size();
}

// Splits at commas that are not inside brackets.
std::vector<std::string> top_level_items(const std::string& s) {
    std::vector<std::string> items;
    std::string cur;
    int depth = 0;
    for (char c : s) {
        if (c == '[') ++depth;
        if (c == ']') --depth;
        if (c == ',' && depth == 0) {
            items.push_back(cur);
            cur.clear();
        } else {
            cur += c;
        }
    }
    items.push_back(cur);
    return items;
}

// Binds a fresh socket to 127.0.0.1:`port` (0: the kernel picks) and returns the port bound, or
// -1 with errno set.
int bind_loopback(int port) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    socklen_t len = sizeof a;
    int bound = -1;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
        bound = ntohs(a.sin_port);
    const int saved = errno;
    ::close(fd);
    errno = saved;
    return bound;
}

} // namespace

int free_loopback_port(std::string& error) {
    int ephemeral_low = 32768; // Linux's default when the range cannot be read
    std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
    int low = 0, high = 0;
    if (range >> low >> high && low > 1024) ephemeral_low = low;
    // Registered ports from 10000 up, short of the ephemeral range; if that leaves too few, any
    // port the kernel gives.
    const int first = 10000, last = ephemeral_low - 1;
    if (last - first >= 1000) {
        std::mt19937 gen(std::random_device{}());
        std::uniform_int_distribution<int> pick(first, last);
        for (int tries = 0; tries < 64; ++tries) {
            int port = bind_loopback(pick(gen));
            if (port > 0) return port;
        }
    }
    int port = bind_loopback(0);
    if (port < 0)
        error = std::string("cannot find a free port on 127.0.0.1: ") + std::strerror(errno);
    return port;
}

std::vector<std::string> expand_nodelist(const std::string& list, std::string& error) {
    std::vector<std::string> hosts;
    for (const std::string& item : top_level_items(list)) {
        size_t open = item.find('[');
        if (open == std::string::npos) {
            if (item.empty() || item.find(']') != std::string::npos) {
                error = "malformed host list `" + list + "`";
                return {};
            }
            hosts.push_back(item);
            continue;
        }
        size_t close = item.find(']', open);
        if (close == std::string::npos || open == 0 ||
            item.find('[', open + 1) != std::string::npos) {
            error = "malformed host list `" + list + "`";
            return {};
        }
        std::string prefix = item.substr(0, open), suffix = item.substr(close + 1);
        for (const std::string& range : top_level_items(item.substr(open + 1, close - open - 1))) {
            size_t dash = range.find('-');
            std::string lo = range.substr(0, dash),
                        hi = dash == std::string::npos ? lo : range.substr(dash + 1);
            int a = 0, b = 0;
            if (!parse_int(lo, a) || !parse_int(hi, b) || a < 0 || b < a || b - a > 100000) {
                error = "malformed range `" + range + "` in host list `" + list + "`";
                return {};
            }
            for (int n = a; n <= b; ++n) {
                std::string digits = std::to_string(n);
                if (digits.size() < lo.size()) digits.insert(0, lo.size() - digits.size(), '0');
                hosts.push_back(prefix + digits + suffix);
            }
        }
    }
    return hosts;
}

std::optional<LaunchInfo> detect_launch(const std::function<const char*(const char*)>& getenv,
                                        std::string& error) {
    LaunchInfo info;
    auto var = [&](const char* name) -> std::optional<std::string> {
        const char* v = getenv(name);
        if (!v) return std::nullopt;
        return std::string(v);
    };
    auto number = [&](const char* name, int& out) {
        std::optional<std::string> v = var(name);
        if (!v) return true;
        if (!parse_int(*v, out) || out < 0) {
            error = name + std::string("=`") + *v + "` is not a non-negative integer";
            return false;
        }
        return true;
    };
    auto read = [&](const char* rank, const char* size, const char* local) {
        return number(rank, info.rank) && number(size, info.world_size) &&
               number(local, info.local_rank);
    };
    if (var("DIST_RANK")) {
        info.launcher = "dist";
        if (!read("DIST_RANK", "DIST_WORLD_SIZE", "DIST_LOCAL_RANK")) return std::nullopt;
        if (!var("DIST_WORLD_SIZE")) {
            error = "DIST_RANK is set but DIST_WORLD_SIZE is not";
            return std::nullopt;
        }
    } else if (var("SLURM_PROCID")) {
        info.launcher = "slurm";
        if (!read("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")) return std::nullopt;
        if (auto nodes = var("SLURM_JOB_NODELIST")) {
            info.hosts = expand_nodelist(*nodes, error);
            if (info.hosts.empty()) {
                error = "SLURM_JOB_NODELIST: " + error;
                return std::nullopt;
            }
            info.coordinator_host = info.hosts.front();
        }
    } else if (var("OMPI_COMM_WORLD_RANK")) {
        info.launcher = "mpirun";
        if (!read("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"))
            return std::nullopt;
    }
    if (info.world_size < 1 || info.rank >= info.world_size) {
        error = "rank " + std::to_string(info.rank) + " is outside a world of " +
                std::to_string(info.world_size) + " (from " + info.launcher + ")";
        return std::nullopt;
    }
    if (auto c = var("DIST_COORDINATOR")) {
        size_t colon = c->rfind(':');
        int port = 0;
        if (colon == std::string::npos || colon == 0 || !parse_int(c->substr(colon + 1), port) ||
            port < 1 || port > 65535) {
            error = "DIST_COORDINATOR=`" + *c + "` is not host:port";
            return std::nullopt;
        }
        info.coordinator_host = c->substr(0, colon);
        info.coordinator_port = port;
    }
    return info;
}

} // namespace dist::transport
