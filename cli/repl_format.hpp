// repl_format.hpp: how the REPL's commands write times, sizes and fractions (and trim input).
#pragma once

#include "actors/sim/simulate.hpp"

#include <cstdint>
#include <cstdio>
#include <string>

namespace dist::cli {

/// Seconds as `12.345 ms` or `1.234 s`; unit costs as a bare number.
inline std::string time_text(const sim::Timeline& t, double seconds) {
    char buf[32];
    if (t.cost == sim::CostModel::unit)
        std::snprintf(buf, sizeof buf, "%g", seconds);
    else if (seconds >= 1)
        std::snprintf(buf, sizeof buf, "%.3f s", seconds);
    else
        std::snprintf(buf, sizeof buf, "%.3f ms", seconds * 1e3);
    return buf;
}

/// Bytes in decimal units: `512 B`, `1.2 kB`, `3.4 MB`, `5.6 GB`.
inline std::string bytes_text(int64_t b) {
    char buf[32];
    double x = static_cast<double>(b);
    if (x >= 1e9)
        std::snprintf(buf, sizeof buf, "%.1f GB", x / 1e9);
    else if (x >= 1e6)
        std::snprintf(buf, sizeof buf, "%.1f MB", x / 1e6);
    else if (x >= 1e3)
        std::snprintf(buf, sizeof buf, "%.1f kB", x / 1e3);
    else
        std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(b));
    return buf;
}

/// `s` without white space at either end.
inline std::string trim(const std::string& s) {
    size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
    return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

inline std::string percent_text(double fraction) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * fraction);
    return buf;
}

/// `rank 3`, or `ranks 4-7` for a run of ranks.
inline std::string ranks_text(int32_t first, int32_t last) {
    return first == last ? "rank " + std::to_string(first)
                         : "ranks " + std::to_string(first) + "-" + std::to_string(last);
}

} // namespace dist::cli
