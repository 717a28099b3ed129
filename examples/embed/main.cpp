// main.cpp: an application that embeds Dist. Run from this folder with no arguments, it trains
// ../gpt_tiny.dist for a few steps on this machine's CPU cores, printing each step's loss, then
// lets the model continue a prompt. Errors come back from the library as values.
#include <dist/dist.hpp>

#include <cstdio>
#include <filesystem>
#include <string>

int main(int argc, char** argv) {
    const std::string path = argc > 1 ? argv[1] : "../gpt_tiny.dist";
    dist::Result<dist::Script> loaded = dist::Script::load(path);
    if (!loaded) {
        std::fprintf(stderr, "%s\n", loaded.error().c_str());
        return 1;
    }
    dist::Script& script = *loaded;
    std::printf("stdlib: %s\n", dist::find_stdlib().c_str());

    // A few steps of the script's 300 (its learning-rate schedule unchanged).
    if (dist::Status s = script.set("train.stop_after", "8"); !s) {
        std::fprintf(stderr, "%s", s.message().c_str());
        return 1;
    }
    // The script reads the text of Debian's `fortunes` package; random tokens without it.
    dist::CheckReport report = script.check();
    if (!report.ok && !std::filesystem::exists("/usr/share/games/fortunes/fortunes")) {
        std::printf("no fortunes installed: training on synthetic data\n");
        script.set("train.data", "synthetic()");
        report = script.check();
    }
    if (!report.ok) {
        std::fprintf(stderr, "%s", report.text.c_str());
        return 1;
    }

    dist::Result<dist::SimFigures> sim = script.simulate();
    if (sim)
        std::printf("simulated: %.1f ms a step, %.0f tokens/s\n", 1e3 * sim->step_time_s,
                    sim->tokens_per_s);

    dist::TrainOptions options;
    options.on_step = [](const dist::StepInfo& step) {
        std::printf("step %3lld  loss %.4f  lr %.2e  %6.0f tok/s  %.0f ms\n",
                    static_cast<long long>(step.step), step.loss, step.lr, step.tokens_per_s,
                    1e3 * step.step_time_s);
        std::fflush(stdout);
        return true; // false would stop the run after this step
    };
    dist::Result<dist::TrainSummary> trained = script.train(options);
    if (!trained) {
        std::fprintf(stderr, "%s\n", trained.error().c_str());
        return 1;
    }
    std::printf("trained steps %lld to %lld, final loss %.4f\n",
                static_cast<long long>(trained->first_step),
                static_cast<long long>(trained->last_step), trained->final_loss);

    dist::GenerateOptions gen;
    gen.max_tokens = 40;
    dist::Result<std::vector<std::string>> texts = script.generate({"The "}, gen);
    if (!texts) {
        std::fprintf(stderr, "%s\n", texts.error().c_str());
        return 1;
    }
    std::string text = texts->front();
    for (char& c : text)
        if (static_cast<unsigned char>(c) < 32 || static_cast<unsigned char>(c) >= 127) c = ' ';
    std::printf("sample: The %s\n", text.c_str());
    return 0;
}
