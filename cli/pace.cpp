// pace.cpp: the profile's matmul timed again around a run (pace.hpp).
#include "cli/pace.hpp"

#include "cli/calibrate_parts.hpp"
#include "kernels/cpu/ops.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace dist::cli {

std::optional<MatmulRate> pace_reference(const Calibration& c) {
    if (c.gpu() || c.cores <= 0) return std::nullopt;
    if (c.pace) return c.pace;
    constexpr double most_flop = 512.0 * 512 * 512;
    // The most threads, then the squarest (its smallest side the largest), then the largest.
    auto key = [](const MatmulRate& r) {
        return std::make_tuple(r.threads, std::min({r.m, r.n, r.k}), r.m * r.n * r.k);
    };
    // Each side within the calibration's grid (to 2048): a row edited by hand to a side of a
    // billion would not ask for gigabytes here.
    auto side = [](int64_t x) { return x > 0 && x <= 4096; };
    std::optional<MatmulRate> best;
    for (const MatmulRate& r : c.matmul) {
        if (r.kernel != "nt" || !(r.warm > 0) || !side(r.m) || !side(r.n) || !side(r.k) ||
            r.threads <= 0 ||
            static_cast<double>(r.m) * static_cast<double>(r.n) * static_cast<double>(r.k) >
                most_flop)
            continue;
        if (!best || key(r) > key(*best)) best = r;
    }
    return best;
}

double pace_flops(const MatmulRate& ref, double min_s) {
    const std::vector<float> in = calibration::filled(ref.m * ref.k),
                             weight = calibration::filled(ref.n * ref.k);
    std::vector<float> out(static_cast<size_t>(ref.m * ref.n));
    const std::function<void()> call = [&] {
        kernels::cpu::matmul_forward<float>(in.data(), weight.data(), nullptr, ref.m, ref.k, ref.n,
                                            out.data());
    };
    const int threads = omp_get_max_threads();
    omp_set_num_threads(ref.threads);
    // Calls for a while first: a team of threads new to this thread, or one whose cores are
    // still taken by the threads of a session just opened or just ended, ran the first
    // batches at a fifth to a half of their rate on two cores here.
    const auto t0 = calibration::Clock::now();
    do call();
    while (calibration::since(t0) < kPaceWarmUp_s);
    // The fastest of batches apart: one of the two cores here ran at half its speed for tens of
    // milliseconds at a time in a slow hour, and three batches back to back all met it.
    const double s = calibration::per_call(call, min_s, kPaceBatches, kPaceGap);
    omp_set_num_threads(threads);
    const double flop =
        2.0 * static_cast<double>(ref.m) * static_cast<double>(ref.n) * static_cast<double>(ref.k);
    return s > 0 ? flop / s : 0.0;
}

double pace_now(const MatmulRate& ref, double min_s) {
    return ref.warm > 0 ? pace_flops(ref, min_s) / ref.warm : 0.0;
}

double pace_at_kept(const std::vector<double>& before, const std::vector<double>& after,
                    const std::vector<double>& pass_pace) {
    std::vector<double> level;
    for (size_t p = 0; p < before.size() && p < after.size() && p < pass_pace.size(); ++p)
        if (before[p] > 0 && after[p] > 0 && pass_pace[p] > 0)
            level.push_back(std::sqrt(before[p] * after[p]) * pass_pace[p]);
    return level.empty() ? 0.0 : calibration::median_of(std::move(level));
}

std::string pace_note(const MatmulRate& ref, double before, double after,
                      const std::string& calibrated_on) {
    // The run's pace: between the two (their geometric mean). One timing alone moves by a
    // tenth or more within seconds on a shared machine.
    const double pace = before > 0 && after > 0 ? std::sqrt(before * after) : 1.0;
    const char* meaning = "the machine ran as calibrated";
    if (pace < 1 - kPaceOff)
        meaning = "slower than calibrated: other load on the host slows the measured steps, "
                  "not the prediction";
    else if (pace > 1 + kPaceOff)
        meaning = "faster than calibrated: the calibration met other load, and the prediction "
                  "is slower than this machine now";
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "pace: the profile's %s matmul %lld x %lld x %lld on %d thread%s ran at %.2fx "
                  "and %.2fx its calibrated rate (%s) before and after the run; %s",
                  ref.kernel.c_str(), static_cast<long long>(ref.m), static_cast<long long>(ref.n),
                  static_cast<long long>(ref.k), ref.threads, ref.threads == 1 ? "" : "s", before,
                  after, calibrated_on.c_str(), meaning);
    return buf;
}

PaceCheck::PaceCheck(const HardwareProfile& profile)
    : ref_(pace_reference(profile.calibration)), date_(profile.calibration.date) {
    // The date alone ("2026-12-07T11:18:38Z" -> "2026-12-07").
    if (const size_t t = date_.find('T'); t != std::string::npos) date_.resize(t);
}

void PaceCheck::before() {
    if (!ref_) return;
    std::this_thread::sleep_for(kPaceSettle);
    before_ = pace_now(*ref_);
}

std::string PaceCheck::after() {
    if (!ref_) return "";
    std::this_thread::sleep_for(kPaceSettle);
    return pace_note(*ref_, before_, pace_now(*ref_), date_.empty() ? "undated" : date_);
}

} // namespace dist::cli
