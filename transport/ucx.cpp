// ucx.cpp: the PointToPoint interface on UCX tagged messages (ucp_tag_send_nbx /
// ucp_tag_recv_nbx), with progress that sleeps on the worker's event fd. Tags and message
// layout: ucx_wire.hpp.
#include "transport/ucx.hpp"

#include <ucp/api/ucp.h>

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <new>
#include <thread>
#include <utility>
#include <vector>

namespace dist::transport {

namespace {

/// Throws a TransportError naming what was being done, the UCX call, where it was made and
/// UCX's own cause: "send of ... : ucx.cpp:140: ucp_tag_send_nbx failed: Shared memory error".
void ucx_check(ucs_status_t status, const char* call, const char* file, int line,
               const std::string& context = {}) {
    if (status == UCS_OK) return;
    const char* base = std::strrchr(file, '/');
    throw TransportError((context.empty() ? "" : context + ": ") +
                         std::string(base ? base + 1 : file) + ":" + std::to_string(line) + ": " +
                         call + " failed: " + ucs_status_string(status));
}
/// A call returning ucs_status_t, and the same with what was being done.
#define DIST_UCX_CHECK(call) ucx_check((call), #call, __FILE__, __LINE__)
#define DIST_UCX_CHECK_IN(call, context) ucx_check((call), #call, __FILE__, __LINE__, context)
/// A call returning a request pointer or an error (ucp_*_nbx), already made.
#define DIST_UCX_CHECK_PTR(ptr, call, context)                                                     \
    ucx_check(UCS_PTR_IS_ERR(ptr) ? UCS_PTR_STATUS(ptr) : UCS_OK, call, __FILE__, __LINE__, context)

constexpr uint64_t kFullMask = ~uint64_t{0};

std::string hex(uint64_t v) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
    return buf;
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

size_t kind(const P2PTag& tag) {
    return tag.direction == Direction::activation ? 0 : 1;
}

std::string ms(std::chrono::milliseconds d) {
    return std::to_string(d.count()) + " ms";
}

// ----- the endpoint ----------------------------------------------------------------------------

struct PendingSend {
    void* request = nullptr;
    kernels::Tensor keep; // holds the storage UCX reads from
    std::unique_ptr<char[]> header;
    int peer = 0;
    P2PTag tag;
};

struct PendingRecv {
    int peer = 0;
    P2PTag tag;
    std::unique_ptr<char[]> header = std::make_unique<char[]>(ucx_wire::kHeaderBufferBytes);
    ucp_tag_recv_info_t info{};
    void* header_request = nullptr;
    bool header_done = false;
    kernels::Tensor tensor;
    void* data_request = nullptr;
    bool done = false;
    std::string error; // set when advancing it failed outside its own recv
};

struct PeerLink {
    int peer = 0;
    ucp_ep_h ep = nullptr;
    std::atomic<ucs_status_t> status{UCS_OK}; // set by UCX's error callback
};

class UcxEndpointImpl final : public UcxEndpoint {
  public:
    UcxEndpointImpl(KeyValueStore& store, std::string prefix, int rank, int size,
                    const UcxOptions& options)
        : store_(store), prefix_(std::move(prefix)), rank_(rank), timeout_(options.timeout),
          detect_peer_failure_(options.detect_peer_failure), spin_(options.spin),
          links_(static_cast<size_t>(size)) {
        stats_.sent.resize(static_cast<size_t>(size));
        stats_.received.resize(static_cast<size_t>(size));
        try {
            start(options);
            progress_thread_ = std::thread([this] { progress_in_background(); });
        } catch (const TransportError& e) {
            teardown();
            auto env = [](const char* name) {
                const char* v = std::getenv(name);
                return std::string(v ? v : "unset");
            };
            throw TransportError(
                prefix_ + ": rank " + std::to_string(rank_) + " could not start UCX (transports " +
                (options.transports.empty() ? "from UCX_TLS=" + env("UCX_TLS")
                                            : options.transports) +
                ", devices " +
                (options.net_devices.empty() ? "from UCX_NET_DEVICES=" + env("UCX_NET_DEVICES")
                                             : options.net_devices) +
                "): " + e.what());
        } catch (...) {
            teardown();
            throw;
        }
    }

    ~UcxEndpointImpl() override { teardown(); }

    int rank() const override { return rank_; }

    void send(int peer, const P2PTag& tag, const kernels::Tensor& tensor) override {
        Turn turn(*this);
        auto start = Clock::now();
        check_peer(peer, "send to");
        throw_if_aborted("send of " + tag.str() + " to rank " + std::to_string(peer));
        uint64_t header_tag = ucx_tag(rank_, tag, false);
        kernels::Tensor t = tensor;
        if (t.defined() && t.device().kind != kernels::Device::Kind::cpu)
            t = t.to(kernels::Allocator::cpu());
        ucx_wire::Header h =
            ucx_wire::describe(t, "send of " + tag.str() + " to rank " + std::to_string(peer));
        bool separate = ucx_wire::data_follows(h);
        ucp_ep_h ep = connect(peer);
        reap_sends();

        size_t header_len = sizeof h + (separate ? 0 : h.bytes);
        auto header = std::make_unique<char[]>(header_len);
        std::memcpy(header.get(), &h, sizeof h);
        if (!separate && h.bytes) std::memcpy(header.get() + sizeof h, t.raw(), h.bytes);
        const char* header_bytes = header.get(); // before the move below
        post_send(ep, header_bytes, header_len, header_tag, peer, tag, std::move(header), {});
        if (separate)
            post_send(ep, t.raw(), h.bytes, ucx_tag(rank_, tag, true), peer, tag, nullptr, t);
        UcxTraffic& traffic = stats_.sent[static_cast<size_t>(peer)][kind(tag)];
        ++traffic.messages;
        traffic.bytes += h.bytes;
        traffic.seconds += seconds_since(start);
    }

    kernels::Tensor recv(int peer, const P2PTag& tag) override {
        Turn turn(*this);
        auto start = Clock::now();
        check_peer(peer, "receive from");
        std::string what = tag.str() + " from rank " + std::to_string(peer);
        auto it = recvs_.find({peer, tag});
        if (it == recvs_.end()) it = post(peer, tag);
        PendingRecv& r = *it->second;
        auto deadline = Clock::now() + timeout_;
        try {
            if (!r.error.empty()) throw TransportError(r.error);
            bool ready = wait(
                [&] {
                    advance_others(&r);
                    return advance(r);
                },
                deadline, peer);
            if (!ready)
                throw TransportError("rank " + std::to_string(rank_) + " waited " + ms(timeout_) +
                                     " for " + what + " (UCX tag " +
                                     hex(ucx_tag(peer, tag, false)) + "); nothing arrived");
        } catch (const TransportError& e) {
            discard(it);
            std::string why = e.what();
            if (why.find(what) == std::string::npos)
                why =
                    "receive on rank " + std::to_string(rank_) + " of " + what + " failed: " + why;
            throw TransportError(why);
        }
        kernels::Tensor out = std::move(r.tensor);
        recvs_.erase(it);
        UcxTraffic& traffic = stats_.received[static_cast<size_t>(peer)][kind(tag)];
        ++traffic.messages;
        traffic.bytes += out.bytes();
        traffic.seconds += seconds_since(start);
        return out;
    }

    void post_recv(int peer, const P2PTag& tag) override {
        Turn turn(*this);
        check_peer(peer, "receive from");
        if (recvs_.count({peer, tag}))
            throw TransportError("rank " + std::to_string(rank_) + " posted the receive of " +
                                 tag.str() + " from rank " + std::to_string(peer) + " twice");
        post(peer, tag);
    }

    void flush() override {
        Turn turn(*this);
        auto deadline = Clock::now() + timeout_;
        if (!wait([&] { return sends_.empty(); }, deadline, -1))
            throw TransportError("rank " + std::to_string(rank_) + ": " +
                                 std::to_string(sends_.size()) + " sends not completed after " +
                                 ms(timeout_) + " (the first: " + sends_.front().tag.str() +
                                 " to rank " + std::to_string(sends_.front().peer) + ")");
        throw_send_error();
    }

    void abort(const std::string& why) override {
        std::lock_guard lock(abort_mutex_);
        if (!abort_reason_.empty()) return;
        abort_reason_ = why.empty() ? "aborted" : why;
        aborted_.store(true);
        // The eventfd wakes a thread sleeping in poll(); a failed write leaves the flag, which
        // the waiting loop also reads after its next wake-up. (Under the mutex: teardown closes
        // the fd under it too.)
        uint64_t one = 1;
        if (abort_fd_ >= 0) {
            [[maybe_unused]] ssize_t n = ::write(abort_fd_, &one, sizeof one);
        }
    }

    void away() override {
        {
            std::lock_guard lock(worker_mutex_);
            if (!in_flight()) return;
            away_ = true;
        }
        looking_.notify_one();  // when it waits for its next look
        wake_progress_thread(); // when it sleeps in poll from an earlier turn
    }

    UcxStats stats() const override {
        std::lock_guard lock(worker_mutex_);
        return stats_;
    }

  private:
    using RecvMap = std::map<std::pair<int, P2PTag>, std::unique_ptr<PendingRecv>>;

    void start(const UcxOptions& options) {
        abort_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (abort_fd_ < 0 || wake_fd_ < 0)
            throw TransportError(std::string("eventfd failed: ") + std::strerror(errno));

        ucp_config_t* raw_config = nullptr;
        DIST_UCX_CHECK(ucp_config_read(nullptr, nullptr, &raw_config));
        std::unique_ptr<ucp_config_t, void (*)(ucp_config_t*)> config(raw_config,
                                                                      &ucp_config_release);
        if (!options.transports.empty())
            DIST_UCX_CHECK(ucp_config_modify(config.get(), "TLS", options.transports.c_str()));
        if (!options.net_devices.empty())
            DIST_UCX_CHECK(
                ucp_config_modify(config.get(), "NET_DEVICES", options.net_devices.c_str()));
        ucp_params_t params{};
        params.field_mask = UCP_PARAM_FIELD_FEATURES;
        params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
        DIST_UCX_CHECK(ucp_init(&params, config.get(), &context_));

        ucp_worker_params_t wparams{};
        wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
        // The rank's thread and the progress thread take turns under worker_mutex_.
        wparams.thread_mode = UCS_THREAD_MODE_SERIALIZED;
        DIST_UCX_CHECK(ucp_worker_create(context_, &wparams, &worker_));
        DIST_UCX_CHECK(ucp_worker_get_efd(worker_, &event_fd_));

        ucp_address_t* address = nullptr;
        size_t length = 0;
        DIST_UCX_CHECK(ucp_worker_get_address(worker_, &address, &length));
        std::vector<char> bytes(reinterpret_cast<char*>(address),
                                reinterpret_cast<char*>(address) + length);
        ucp_worker_release_address(worker_, address);
        store_.set(address_key(rank_), bytes);
    }

    // While the rank's thread is elsewhere (computing, or blocked in a Gloo collective), this
    // thread keeps the worker moving: a rendezvous transfer over TCP needs both sides to
    // progress (the receiver answers the sender's request, the sender then pushes the data), so
    // without it a send whose rank went on to a collective with its receiver never completes.
    //
    // It steps in when the rank's thread says it is going away, or when a look (every
    // kLookEvery) finds that the thread has made no call since the last look while transfers are
    // in flight. It then progresses the worker, sleeping on its event fd, until the rank's thread
    // calls again or nothing is in flight. Calls that follow each other closely progress the
    // worker themselves: a second thread woken by the same events, or by a timer, slows the
    // transfers both are waiting for (a 10 ms look cost a quarter of the 64 KB round trip here).
    void progress_in_background() {
        std::unique_lock lock(worker_mutex_);
        uint64_t seen = calls_;
        while (!stopping_.load()) {
            looking_.wait_for(lock, kLookEvery, [&] { return stopping_.load() || away_; });
            if (stopping_.load()) break;
            const bool told = away_;
            away_ = false;
            if (!told && (calls_ != seen || !in_flight())) {
                seen = calls_;
                continue;
            }
            seen = calls_;
            try {
                while (!stopping_.load() && (calls_ == seen || away_)) {
                    if (away_) seen = calls_; // told again from a later turn
                    away_ = false;
                    while (ucp_worker_progress(worker_) != 0) {
                    }
                    reap_sends();
                    advance_others(nullptr); // headers that arrived: post their data's receives
                    if (!in_flight()) break;
                    ucs_status_t armed = ucp_worker_arm(worker_);
                    lock.unlock();
                    if (armed == UCS_ERR_BUSY) {
                        std::this_thread::yield(); // events meanwhile: let the rank in first
                    } else {
                        pollfd fds[2] = {{event_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
                        // A failed arm falls back to polling every 10 ms.
                        ::poll(fds, 2, armed == UCS_OK ? 1000 : 10);
                        uint64_t drained;
                        [[maybe_unused]] ssize_t n = ::read(wake_fd_, &drained, sizeof drained);
                    }
                    lock.lock();
                }
            } catch (const std::exception& e) {
                // Nothing may escape a thread; the rank's next send or flush reports it, and
                // its own waits go on progressing the worker.
                if (lock.owns_lock() && send_error_.empty())
                    send_error_ = "rank " + std::to_string(rank_) +
                                  ": the UCX progress thread failed: " + e.what();
                return;
            }
            seen = calls_;
        }
    }

    void wake_progress_thread() {
        uint64_t one = 1;
        [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
    }

    // Sends not completed, or receives posted and not complete: what the worker must move on.
    bool in_flight() const {
        if (!sends_.empty()) return true;
        return std::any_of(recvs_.begin(), recvs_.end(), [](const auto& r) {
            return !r.second->done && r.second->error.empty();
        });
    }

    // The rank's thread inside the endpoint: it holds the worker for the call, and counts it so
    // that the progress thread knows it was here.
    class Turn {
      public:
        explicit Turn(UcxEndpointImpl& e) : lock_(e.worker_mutex_) {
            ++e.calls_;
            e.away_ = false;
        }

      private:
        std::lock_guard<std::mutex> lock_;
    };

    void stop_progress_thread() {
        if (!progress_thread_.joinable()) return;
        {
            std::lock_guard lock(worker_mutex_);
            stopping_.store(true);
        }
        looking_.notify_all();
        wake_progress_thread();
        progress_thread_.join();
    }

    void teardown() {
        stop_progress_thread();
        if (wake_fd_ >= 0) ::close(wake_fd_);
        wake_fd_ = -1;
        if (worker_) {
            // Let sends finish unless the job is being torn down after a failure.
            if (!aborted_.load()) {
                try {
                    wait([&] { return sends_.empty(); }, Clock::now() + timeout_, -1);
                } catch (const TransportError&) {
                }
            }
            while (!recvs_.empty()) discard(recvs_.begin());
            // A send still in flight is released by UCX when the worker goes; its buffers
            // stay alive until then, out of sends_ so that no later wait looks at a request
            // already freed.
            for (auto& s : sends_) ucp_request_free(s.request);
            released_.splice(released_.end(), sends_);
            close_links();
            ucp_worker_destroy(worker_);
            worker_ = nullptr;
        }
        // Buffers of requests UCX never finished with are freed only now that it is gone.
        released_.clear();
        sends_.clear();
        zombies_.clear();
        if (context_) ucp_cleanup(context_);
        context_ = nullptr;
        std::lock_guard lock(abort_mutex_);
        if (abort_fd_ >= 0) ::close(abort_fd_);
        abort_fd_ = -1;
    }

    // Closes every endpoint before the worker goes: gracefully where the link is sound (its
    // queued messages are delivered), forcibly where UCX reported it failed or after abort.
    void close_links() {
        std::vector<void*> closing;
        for (auto& link : links_) {
            if (!link.ep) continue;
            ucp_request_param_t param{};
            param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
            bool sound = link.status.load() == UCS_OK && !(aborted_.load() && detect_peer_failure_);
            param.flags = sound ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
            void* request = ucp_ep_close_nbx(link.ep, &param);
            link.ep = nullptr;
            if (request && !UCS_PTR_IS_ERR(request)) closing.push_back(request);
        }
        auto deadline =
            Clock::now() + std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(2));
        auto all_closed = [&] {
            return std::all_of(closing.begin(), closing.end(), [](void* r) {
                return ucp_request_check_status(r) != UCS_INPROGRESS;
            });
        };
        try {
            wait(all_closed, deadline, -1, false);
        } catch (const TransportError&) {
        }
        for (void* r : closing) ucp_request_free(r);
    }

    std::string address_key(int rank) const { return prefix_ + "/ucx/" + std::to_string(rank); }

    void check_peer(int peer, const char* verb) const {
        if (peer < 0 || static_cast<size_t>(peer) >= links_.size())
            throw TransportError("rank " + std::to_string(rank_) + " cannot " + verb + " rank " +
                                 std::to_string(peer) + ": the group has " +
                                 std::to_string(links_.size()) + " ranks");
    }

    void throw_if_aborted(const std::string& what) const {
        if (!aborted_.load()) return;
        std::lock_guard lock(abort_mutex_);
        throw TransportError(what + " on rank " + std::to_string(rank_) +
                             " after abort: " + abort_reason_);
    }

    void throw_send_error() {
        if (send_error_.empty()) return;
        std::string e = std::move(send_error_);
        send_error_.clear();
        throw TransportError(e);
    }

    static void on_link_error(void* arg, ucp_ep_h, ucs_status_t status) {
        static_cast<PeerLink*>(arg)->status.store(status);
    }

    ucp_ep_h connect(int peer) {
        PeerLink& link = links_[static_cast<size_t>(peer)];
        if (link.ep) return link.ep;
        std::vector<char> address;
        try {
            address = store_.get(address_key(peer), timeout_);
        } catch (const std::exception& e) {
            throw TransportError("rank " + std::to_string(rank_) +
                                 " found no UCX address of rank " + std::to_string(peer) + ": " +
                                 e.what());
        }
        if (address.empty())
            throw TransportError("rank " + std::to_string(rank_) + ": rank " +
                                 std::to_string(peer) + " published an empty UCX address");
        link.peer = peer;
        ucp_ep_params_t params{};
        params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                            UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
        params.address = reinterpret_cast<const ucp_address_t*>(address.data());
        params.err_mode =
            detect_peer_failure_ ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
        params.err_handler.cb = &on_link_error;
        params.err_handler.arg = &link;
        DIST_UCX_CHECK_IN(ucp_ep_create(worker_, &params, &link.ep),
                          "rank " + std::to_string(rank_) + " connecting to rank " +
                              std::to_string(peer));
        return link.ep;
    }

    void post_send(ucp_ep_h ep, const void* buffer, size_t length, uint64_t ucx_tag_value, int peer,
                   const P2PTag& tag, std::unique_ptr<char[]> header, kernels::Tensor keep) {
        ucp_request_param_t param{};
        void* request = ucp_tag_send_nbx(ep, buffer, length, ucx_tag_value, &param);
        DIST_UCX_CHECK_PTR(request, "ucp_tag_send_nbx",
                           "send of " + tag.str() + " from rank " + std::to_string(rank_) +
                               " to rank " + std::to_string(peer));
        if (!request) return; // done: UCX copied it or sent it already
        sends_.push_back({request, std::move(keep), std::move(header), peer, tag});
    }

    // Frees completed sends; remembers the first failure for the next send or flush.
    void reap_sends() {
        for (auto it = sends_.begin(); it != sends_.end();) {
            ucs_status_t status = ucp_request_check_status(it->request);
            if (status == UCS_INPROGRESS) {
                ++it;
                continue;
            }
            if (status != UCS_OK && send_error_.empty())
                send_error_ = "send of " + it->tag.str() + " from rank " + std::to_string(rank_) +
                              " to rank " + std::to_string(it->peer) +
                              " failed: " + ucs_status_string(status);
            ucp_request_free(it->request);
            it = sends_.erase(it);
        }
    }

    RecvMap::iterator post(int peer, const P2PTag& tag) {
        uint64_t header_tag = ucx_tag(peer, tag, false);
        throw_if_aborted("receive of " + tag.str() + " from rank " + std::to_string(peer));
        // The link is not needed to receive, but it is how UCX tells us the peer is gone.
        connect(peer);
        auto r = std::make_unique<PendingRecv>();
        r->peer = peer;
        r->tag = tag;
        r->header_request =
            post_tag_recv(r->header.get(), ucx_wire::kHeaderBufferBytes, header_tag,
                          "receive of " + tag.str() + " from rank " + std::to_string(peer));
        return recvs_.emplace(std::pair{peer, tag}, std::move(r)).first;
    }

    // Posts a tagged receive and returns its request, which is tested later. Always a request:
    // UCX 1.13 leaves the receive info unset when a receive completes at once, so immediate
    // completion is turned off (and its callback does nothing).
    void* post_tag_recv(void* buffer, size_t length, uint64_t ucx_tag_value,
                        const std::string& what) {
        ucp_request_param_t param{};
        param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
        param.cb.recv = [](void*, ucs_status_t, const ucp_tag_recv_info_t*, void*) {};
        void* request = ucp_tag_recv_nbx(worker_, buffer, length, ucx_tag_value, kFullMask, &param);
        DIST_UCX_CHECK_PTR(request, "ucp_tag_recv_nbx", what + " on rank " + std::to_string(rank_));
        if (!request)
            throw TransportError(what + " on rank " + std::to_string(rank_) +
                                 ": ucp_tag_recv_nbx returned no request");
        return request;
    }

    // Moves a receive on as far as it can go without waiting; true once its tensor is there.
    bool advance(PendingRecv& r) {
        if (r.done) return true;
        if (r.header_request) {
            ucs_status_t status = ucp_tag_recv_request_test(r.header_request, &r.info);
            if (status == UCS_INPROGRESS) return false;
            ucp_request_free(r.header_request);
            r.header_request = nullptr;
            if (status != UCS_OK)
                throw TransportError("UCX failed the header of " + r.tag.str() + " from rank " +
                                     std::to_string(r.peer) + ": " + ucs_status_string(status));
            r.header_done = true;
        }
        if (r.header_done && !r.tensor.defined() && !r.data_request) {
            if (unpack_header(r)) return r.done = true;
        }
        if (r.data_request) {
            ucp_tag_recv_info_t info{};
            ucs_status_t status = ucp_tag_recv_request_test(r.data_request, &info);
            if (status == UCS_INPROGRESS) return false;
            ucp_request_free(r.data_request);
            r.data_request = nullptr;
            if (status != UCS_OK)
                throw TransportError("UCX failed the data of " + r.tag.str() + " from rank " +
                                     std::to_string(r.peer) + ": " + ucs_status_string(status));
            if (info.length != r.tensor.bytes())
                throw TransportError("the data of " + r.tag.str() + " from rank " +
                                     std::to_string(r.peer) + " has " +
                                     std::to_string(info.length) + " bytes, its header said " +
                                     std::to_string(r.tensor.bytes()));
            r.done = true;
        }
        return r.done;
    }

    // Posted receives other than the one being waited for (if any): their large tensors start
    // landing in place as soon as their headers arrive. A failure is kept for their own recv.
    void advance_others(const PendingRecv* current) {
        for (auto& [key, r] : recvs_) {
            if (r.get() == current || r->done || !r->error.empty()) continue;
            try {
                advance(*r);
            } catch (const TransportError& e) {
                r->error = e.what();
            }
        }
    }

    // Checks the header and allocates the tensor; true when the message is complete (the data
    // came inline), false when the data follows and its receive is posted.
    bool unpack_header(PendingRecv& r) {
        std::string from = r.tag.str() + " from rank " + std::to_string(r.peer);
        ucx_wire::Announced a = ucx_wire::read(r.header.get(), r.info.length, from);
        r.tensor = std::move(a.tensor);
        if (a.complete) return true;
        r.data_request =
            post_tag_recv(r.tensor.raw(), r.tensor.bytes(), ucx_tag(r.peer, r.tag, true),
                          "receive of the data of " + from);
        return false;
    }

    // Cancels a receive that will not be returned. A request UCX cannot finish cancelling keeps
    // its buffers alive until the worker is destroyed.
    void discard(RecvMap::iterator it) {
        std::unique_ptr<PendingRecv> r = std::move(it->second);
        recvs_.erase(it);
        bool pending = cancel(r->header_request) | cancel(r->data_request);
        r->header_request = r->data_request = nullptr;
        if (pending) zombies_.push_back(std::move(r));
    }

    // Cancels and frees `request`; true when UCX still owned it afterwards.
    bool cancel(void* request) {
        if (!request) return false;
        if (ucp_request_check_status(request) == UCS_INPROGRESS) {
            ucp_request_cancel(worker_, request);
            try {
                wait([&] { return ucp_request_check_status(request) != UCS_INPROGRESS; },
                     Clock::now() + std::chrono::seconds(1), -1, false);
            } catch (const TransportError&) {
            }
        }
        bool still = ucp_request_check_status(request) == UCS_INPROGRESS;
        ucp_request_free(request);
        return still;
    }

    // Progresses the worker until `ready()` or the deadline (false), sleeping on the worker's
    // event fd and the abort eventfd between events. Throws after an abort (when `abortable`),
    // or when the link to `peer` (>= 0) failed.
    template <typename Ready>
    bool wait(Ready&& ready, Clock::time_point deadline, int peer, bool abortable = true) {
        auto spin_until = spin_.count() ? Clock::now() + spin_ : Clock::time_point{};
        for (;;) {
            while (ucp_worker_progress(worker_) != 0) {
            }
            reap_sends();
            if (ready()) return true;
            if (abortable) throw_if_aborted("waiting");
            if (peer >= 0) {
                ucs_status_t s = links_[static_cast<size_t>(peer)].status.load();
                if (s != UCS_OK)
                    throw TransportError("the UCX link from rank " + std::to_string(rank_) +
                                         " to rank " + std::to_string(peer) +
                                         " failed: " + ucs_status_string(s));
            }
            auto now = Clock::now();
            if (now >= deadline) return false;
            if (now < spin_until) continue;
            ucs_status_t armed = ucp_worker_arm(worker_);
            if (armed == UCS_ERR_BUSY) continue; // events arrived meanwhile: progress again
            ucx_check(armed, "ucp_worker_arm(worker_)", __FILE__, __LINE__);
            auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
            // Woken by UCX's events or abort; the cap re-checks link failures now and then.
            int sleep = static_cast<int>(std::min<long long>(left, 1000));
            pollfd fds[2] = {{event_fd_, POLLIN, 0}, {abort_fd_, POLLIN, 0}};
            if (::poll(fds, abortable ? 2 : 1, sleep) < 0 && errno != EINTR)
                throw TransportError(std::string("poll on the UCX event fd failed: ") +
                                     std::strerror(errno));
        }
    }

    KeyValueStore& store_;
    std::string prefix_;
    int rank_;
    std::chrono::milliseconds timeout_;
    bool detect_peer_failure_;
    std::chrono::microseconds spin_;
    ucp_context_h context_ = nullptr;
    ucp_worker_h worker_ = nullptr;
    int event_fd_ = -1;
    int abort_fd_ = -1;
    int wake_fd_ = -1; // wakes the progress thread from poll (to end it, or when told away)
    // The worker and everything it touches (requests, receives, statistics) belong to whichever
    // thread holds this: the rank's, inside a call, or the progress thread, between calls.
    mutable std::mutex worker_mutex_;
    std::condition_variable looking_; // the progress thread waits here between looks
    uint64_t calls_ = 0;              // calls the rank's thread has made (under worker_mutex_)
    bool away_ = false;               // it said it is going away (under worker_mutex_)
    static constexpr std::chrono::milliseconds kLookEvery{250};
    std::thread progress_thread_;
    std::atomic<bool> stopping_{false};
    std::vector<PeerLink> links_;
    std::list<PendingSend> sends_;
    std::list<PendingSend> released_; // at teardown: requests freed, buffers kept until the end
    RecvMap recvs_;
    std::vector<std::unique_ptr<PendingRecv>> zombies_;
    std::string send_error_;
    UcxStats stats_;
    std::atomic<bool> aborted_{false};
    mutable std::mutex abort_mutex_;
    std::string abort_reason_;
};

} // namespace

std::unique_ptr<UcxEndpoint> make_ucx_endpoint(KeyValueStore& store, const std::string& prefix,
                                               int rank, int size, const UcxOptions& options) {
    if (size < 1 || rank < 0 || rank >= size)
        throw TransportError(prefix + ": no rank " + std::to_string(rank) + " in a group of " +
                             std::to_string(size));
    if (size > 65536)
        throw TransportError(prefix + ": a group of " + std::to_string(size) +
                             " ranks; UCX tags carry at most 65536");
    return std::make_unique<UcxEndpointImpl>(store, prefix, rank, size, options);
}

} // namespace dist::transport
