// What the worker does when a remote device fails during a run over RPC servers (PROTOCOL.md,
// "Faults"). ggml's RPC client aborts the process on a closed connection or a malformed answer
// (GGML_ABORT in ggml-rpc.cpp): the abort callback turns that into exit status
// REMOTE_FAILED_STATUS with ggml's words as the last line on stderr. A server that stops
// answering without closing its connection (stopped, or its host gone) would keep a request
// waiting inside ggml forever: a watchdog thread ends the worker the same way when the request
// being handled made no progress (no node asked about, no batch decoded, no load progress) for
// the RPC timeout.

#include "worker.h"

#include <atomic>
#include <thread>
#include <unistd.h>

namespace {

std::atomic<int64_t> g_timeout_ms{0};  // 0: not watching
std::atomic<int64_t> g_last_ms{0};
std::atomic<bool> g_armed{false};
std::atomic<bool> g_ending{false};

int64_t steady_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// One last line on stderr, then the exit: _exit, because other threads (the thread pool, the
// RPC client) are inside ggml and static destructors would race them.
[[noreturn]] void end_remote(const std::string & why) {
    if (!g_ending.exchange(true)) {
        std::string line = "opledger-llama-worker: a remote device failed: " + why + "\n";
        ssize_t n = write(2, line.data(), line.size());
        (void) n;
        _exit(REMOTE_FAILED_STATUS);
    }
    for (;;) {
        std::this_thread::sleep_for(std::chrono::seconds(1));
    }
}

void on_abort(const char * message) {
    std::string text = message ? message : "ggml aborted";
    // "<file>:<line>: <words>": an abort inside ggml's RPC client is a remote failure
    size_t colon = text.find(": ");
    std::string where = colon == std::string::npos ? std::string() : text.substr(0, colon);
    std::string words = colon == std::string::npos ? text : text.substr(colon + 2);
    while (!words.empty() && (words.back() == '\n' || words.back() == ' ')) {
        words.pop_back();
    }
    if (where.find("ggml-rpc") != std::string::npos || words.find("RPC server") != std::string::npos) {
        end_remote("llama.cpp aborted the run: " + words);
    }
    // any other abort ends the worker as before (SIGABRT, ggml's words on stderr)
    fprintf(stderr, "%s\n", text.c_str());
    fflush(stderr);
}

}  // namespace

void remote_tick() {
    if (g_timeout_ms.load(std::memory_order_relaxed) > 0) {
        g_last_ms.store(steady_ms(), std::memory_order_relaxed);
    }
}

void remote_arm(bool on) {
    if (g_timeout_ms.load() > 0) {
        // progress first, then armed: the watchdog never sees an old tick armed
        remote_tick();
        g_armed.store(on);
    }
}

void remote_watch(int64_t timeout_ms) {
    if (timeout_ms < 1) {
        timeout_ms = 1;
    }
    bool first = g_timeout_ms.exchange(timeout_ms) == 0;
    remote_tick();
    if (!first) {
        return;
    }
    ggml_set_abort_callback(on_abort);
    std::thread([] {
        for (;;) {
            int64_t timeout = g_timeout_ms.load();
            std::this_thread::sleep_for(std::chrono::milliseconds(std::min<int64_t>(std::max<int64_t>(timeout / 10, 10), 500)));
            if (!g_armed.load()) {
                continue;
            }
            int64_t idle = steady_ms() - g_last_ms.load();
            if (idle > timeout) {
                char why[256];
                snprintf(why, sizeof why,
                         "no progress for %.1f s (--rpc-timeout): a remote RPC server stopped answering, or one step "
                         "of the run takes longer than the timeout (a FUSED decode, which reports no node, counts as "
                         "one step; raise --rpc-timeout then)",
                         (double) timeout / 1e3);
                end_remote(why);
            }
        }
    }).detach();
}
