// train_tool.cpp: an application that embeds libdist to train, as the cluster tests run it:
// `embed_train_tool [--slow-first-step MS] SCRIPT METRICS [KEY=VALUE ...]` trains SCRIPT with the
// overrides, writing the metrics (its step callback takes MS milliseconds after step 1); started
// under a launcher's environment (DIST_RANK ...), each process of the job is one such
// application.
#include "dist/dist.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

int main(int argc, char** argv) {
    long slow_ms = 0;
    if (argc > 2 && std::string(argv[1]) == "--slow-first-step") {
        slow_ms = std::atol(argv[2]);
        argc -= 2;
        argv += 2;
    }
    if (argc < 3) {
        std::fprintf(stderr, "usage: embed_train_tool SCRIPT METRICS [KEY=VALUE ...]\n");
        return 2;
    }
    auto script = dist::Script::load(argv[1]);
    if (!script.ok()) {
        std::fprintf(stderr, "error: %s\n", script.error().c_str());
        return 1;
    }
    for (int i = 3; i < argc; ++i) {
        std::string kv = argv[i];
        auto eq = kv.find('=');
        dist::Status s = eq == std::string::npos
                             ? dist::Status::error("`" + kv + "` is no KEY=VALUE")
                             : script->set(kv.substr(0, eq), kv.substr(eq + 1));
        if (!s.ok()) {
            std::fprintf(stderr, "error: %s\n", s.message().c_str());
            return 2;
        }
    }
    dist::TrainOptions options;
    options.metrics_path = argv[2];
    if (slow_ms > 0)
        options.on_step = [slow_ms](const dist::StepInfo& step) {
            if (step.step == 1) std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms));
            return true;
        };
    auto trained = script->train(options);
    if (!trained.ok()) {
        std::fprintf(stderr, "error: %s\n", trained.error().c_str());
        return 1;
    }
    std::printf("trained steps %lld to %lld\n", static_cast<long long>(trained->first_step),
                static_cast<long long>(trained->last_step));
    return 0;
}
