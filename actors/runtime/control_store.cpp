// control_store.cpp: the job's key-value store (where UCX endpoints and Gloo groups meet), kept
// by the coordinator and reached through it by every process; and the address this host is
// reached at by the other processes.
#include "actors/runtime/control_store.hpp"
#include "actors/runtime/protocol.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <stdexcept>
#include <sys/socket.h>
#include <unistd.h>

namespace dist::runtime {

namespace {

// The job's key-value store, kept by the coordinator.
class ControlStore final : public transport::KeyValueStore {
  public:
    ControlStore(caf::actor_system& sys, caf::actor coordinator)
        : sys_(sys), coordinator_(std::move(coordinator)) {}
    void set(const std::string& key, const std::vector<char>& value) override {
        caf::scoped_actor self{sys_};
        std::string error;
        self->request(coordinator_, std::chrono::seconds(30), set_atom::value, key,
                      std::string(value.begin(), value.end()))
            .receive([](ok_atom) {}, [&](caf::error& e) { error = sys_.render(e); });
        if (!error.empty())
            throw std::runtime_error("the job's store did not take `" + key + "`: " + error);
    }
    std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override {
        caf::scoped_actor self{sys_};
        std::vector<char> value;
        std::string error;
        self->request(coordinator_, timeout, get_atom::value, key)
            .receive([&](std::string& v) { value.assign(v.begin(), v.end()); },
                     [&](caf::error& e) { error = sys_.render(e); });
        if (!error.empty())
            throw std::runtime_error("the job's store has no `" + key + "` after " +
                                     std::to_string(timeout.count()) + " ms: " + error);
        return value;
    }

  private:
    caf::actor_system& sys_;
    caf::actor coordinator_;
};

} // namespace

std::string host_name() {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    return host;
}

bool loopback(const std::string& host) {
    return host == "127.0.0.1" || host == "localhost" || host == "::1" ||
           host.rfind("127.", 0) == 0;
}

// The address of this host's interface that reaches `host` (where Gloo should listen).
std::string address_towards(const std::string& host, uint16_t port) {
    if (loopback(host)) return "127.0.0.1";
    // A UDP "connection" sends nothing; it makes the kernel pick the route and so the
    // interface's address.
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_DGRAM;
    if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
        return "127.0.0.1";
    std::string out = "127.0.0.1";
    int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
    if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
        sockaddr_in me{};
        socklen_t len = sizeof me;
        char text[INET_ADDRSTRLEN] = {};
        if (::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0 &&
            ::inet_ntop(AF_INET, &me.sin_addr, text, sizeof text))
            out = text;
    }
    if (fd >= 0) ::close(fd);
    freeaddrinfo(res);
    return out;
}

std::unique_ptr<transport::KeyValueStore> make_control_store(caf::actor_system& sys,
                                                             caf::actor coordinator) {
    return std::make_unique<ControlStore>(sys, std::move(coordinator));
}

} // namespace dist::runtime
