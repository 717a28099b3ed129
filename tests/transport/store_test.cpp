// store_test.cpp: the file-based key-value store that processes of one host meet through.
#include "transport/store.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <future>
#include <thread>

using namespace dist::transport;

namespace {

std::filesystem::path fresh_dir() {
    std::string templ = (std::filesystem::temp_directory_path() / "dist-store-XXXXXX").string();
    if (!::mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed");
    return templ;
}

std::vector<char> bytes(const std::string& s) {
    return {s.begin(), s.end()};
}

} // namespace

TEST(FileStore, AValueSetThroughOneStoreIsReadThroughAnother) {
    auto dir = fresh_dir();
    FileStore writer(dir), reader(dir);
    writer.set("job/ucx/0", bytes("address of rank 0"));
    EXPECT_EQ(reader.get("job/ucx/0", std::chrono::milliseconds(100)), bytes("address of rank 0"));
    // Binary values and a value replaced by a later set.
    std::vector<char> binary{'\0', '\xff', '\n', 'x'};
    writer.set("job/ucx/0", binary);
    EXPECT_EQ(reader.get("job/ucx/0", std::chrono::milliseconds(100)), binary);
    std::filesystem::remove_all(dir);
}

TEST(FileStore, GetWaitsForALaterSet) {
    auto dir = fresh_dir();
    FileStore a(dir), b(dir);
    auto got = std::async(std::launch::async,
                          [&] { return b.get("late", std::chrono::milliseconds(5000)); });
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    a.set("late", bytes("here"));
    ASSERT_EQ(got.wait_for(std::chrono::seconds(5)), std::future_status::ready);
    EXPECT_EQ(got.get(), bytes("here"));
    std::filesystem::remove_all(dir);
}

TEST(FileStore, AMissingKeyTimesOutNamingTheKey) {
    auto dir = fresh_dir();
    FileStore s(dir);
    try {
        s.get("job/ucx/7", std::chrono::milliseconds(30));
        FAIL() << "no timeout";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("job/ucx/7"), std::string::npos) << e.what();
    }
    std::filesystem::remove_all(dir);
}

TEST(FileStore, KeysStayInsideTheDirectory) {
    auto root = fresh_dir();
    auto dir = root / "store";
    FileStore s(dir);
    s.set("../escape", bytes("x"));
    s.set("a/b", bytes("1"));
    s.set("a%2Fb", bytes("2"));
    EXPECT_FALSE(std::filesystem::exists(root / "escape"));
    EXPECT_EQ(s.get("a/b", std::chrono::milliseconds(10)), bytes("1"));
    EXPECT_EQ(s.get("a%2Fb", std::chrono::milliseconds(10)), bytes("2"));
    size_t files = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
    EXPECT_EQ(files, 3u); // no temporary file is left behind
    std::filesystem::remove_all(root);
}
