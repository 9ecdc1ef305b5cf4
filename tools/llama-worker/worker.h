// Shared by the worker's source files: the small JSON value and parser, the answer writers,
// llama.cpp's log ring, the instrument (the eval callback) and the worker's state. Public
// headers only (llama.h brings ggml.h, ggml-cpu.h and ggml-backend.h).
#pragma once

#include "llama.h"
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iostream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

// ---------------------------------------------------------------------------------------------
// A small JSON value and parser (requests are small objects; answers are written by hand).

struct Json {
    enum Kind { Null, Bool, Num, Str, Arr, Obj } kind = Null;
    bool b = false;
    double num = 0;
    std::string str;
    std::vector<Json> arr;
    std::map<std::string, Json> obj;

    const Json * get(const std::string & key) const {
        if (kind != Obj) {
            return nullptr;
        }
        auto it = obj.find(key);
        return it == obj.end() ? nullptr : &it->second;
    }
};

struct Parser {
    const std::string & s;
    size_t i = 0;

    explicit Parser(const std::string & text) : s(text) {}

    [[noreturn]] void fail(const char * what) const {
        throw std::runtime_error(std::string("request is not valid JSON: ") + what + " at byte " +
                                 std::to_string(i));
    }

    void ws() {
        while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n')) {
            i++;
        }
    }

    bool lit(const char * w) {
        size_t n = strlen(w);
        if (s.compare(i, n, w) == 0) {
            i += n;
            return true;
        }
        return false;
    }

    Json value(int depth) {
        if (depth > 16) {
            fail("nested too deep");
        }
        ws();
        if (i >= s.size()) {
            fail("unexpected end");
        }
        Json v;
        char c = s[i];
        if (c == '{') {
            v.kind = Json::Obj;
            i++;
            ws();
            if (i < s.size() && s[i] == '}') {
                i++;
                return v;
            }
            for (;;) {
                ws();
                if (i >= s.size() || s[i] != '"') {
                    fail("expected a key");
                }
                std::string k = string();
                ws();
                if (i >= s.size() || s[i] != ':') {
                    fail("expected ':'");
                }
                i++;
                v.obj[k] = value(depth + 1);
                ws();
                if (i < s.size() && s[i] == ',') {
                    i++;
                    continue;
                }
                if (i < s.size() && s[i] == '}') {
                    i++;
                    return v;
                }
                fail("expected ',' or '}'");
            }
        }
        if (c == '[') {
            v.kind = Json::Arr;
            i++;
            ws();
            if (i < s.size() && s[i] == ']') {
                i++;
                return v;
            }
            for (;;) {
                v.arr.push_back(value(depth + 1));
                ws();
                if (i < s.size() && s[i] == ',') {
                    i++;
                    continue;
                }
                if (i < s.size() && s[i] == ']') {
                    i++;
                    return v;
                }
                fail("expected ',' or ']'");
            }
        }
        if (c == '"') {
            v.kind = Json::Str;
            v.str = string();
            return v;
        }
        if (lit("true")) {
            v.kind = Json::Bool;
            v.b = true;
            return v;
        }
        if (lit("false")) {
            v.kind = Json::Bool;
            return v;
        }
        if (lit("null")) {
            return v;
        }
        if (c == '-' || (c >= '0' && c <= '9')) {
            size_t start = i;
            i++;
            while (i < s.size() && (isdigit((unsigned char) s[i]) || s[i] == '.' || s[i] == 'e' ||
                                    s[i] == 'E' || s[i] == '+' || s[i] == '-')) {
                i++;
            }
            v.kind = Json::Num;
            v.num = strtod(s.substr(start, i - start).c_str(), nullptr);
            return v;
        }
        fail("unexpected character");
    }

    std::string string() {
        std::string out;
        i++;  // the opening quote
        while (i < s.size() && s[i] != '"') {
            if (s[i] == '\\') {
                i++;
                if (i >= s.size()) {
                    fail("unterminated escape");
                }
                switch (s[i]) {
                    case 'n': out += '\n'; break;
                    case 't': out += '\t'; break;
                    case 'r': out += '\r'; break;
                    case 'b': out += '\b'; break;
                    case 'f': out += '\f'; break;
                    case 'u': {
                        if (i + 4 >= s.size()) {
                            fail("short \\u escape");
                        }
                        unsigned cp = (unsigned) strtoul(s.substr(i + 1, 4).c_str(), nullptr, 16);
                        i += 4;
                        if (cp < 0x80) {
                            out += (char) cp;
                        } else if (cp < 0x800) {
                            out += (char) (0xC0 | (cp >> 6));
                            out += (char) (0x80 | (cp & 0x3F));
                        } else {
                            out += (char) (0xE0 | (cp >> 12));
                            out += (char) (0x80 | ((cp >> 6) & 0x3F));
                            out += (char) (0x80 | (cp & 0x3F));
                        }
                        break;
                    }
                    default: out += s[i];
                }
                i++;
            } else {
                out += s[i++];
            }
        }
        if (i >= s.size()) {
            fail("unterminated string");
        }
        i++;  // the closing quote
        return out;
    }
};

inline Json parse_json(const std::string & line) {
    Parser p(line);
    Json v = p.value(0);
    p.ws();
    if (p.i != line.size()) {
        p.fail("trailing characters");
    }
    return v;
}

// Request fields: a missing or mistyped field is an error naming it.
inline const Json & field(const Json & req, const char * key, Json::Kind kind) {
    const Json * v = req.get(key);
    if (v == nullptr) {
        throw std::runtime_error(std::string("field '") + key + "' is missing");
    }
    if (v->kind != kind) {
        throw std::runtime_error(std::string("field '") + key + "' has the wrong type");
    }
    return *v;
}

inline int64_t int_field(const Json & req, const char * key) {
    double d = field(req, key, Json::Num).num;
    if (d != std::floor(d) || std::fabs(d) > 9.0e15) {
        throw std::runtime_error(std::string("field '") + key + "' is not an integer");
    }
    return (int64_t) d;
}

inline bool bool_field(const Json & req, const char * key, bool fallback) {
    const Json * v = req.get(key);
    if (v == nullptr || v->kind == Json::Null) {
        return fallback;
    }
    if (v->kind != Json::Bool) {
        throw std::runtime_error(std::string("field '") + key + "' is not a boolean");
    }
    return v->b;
}

inline std::string str_field(const Json & req, const char * key, const char * fallback) {
    const Json * v = req.get(key);
    if (v == nullptr || v->kind == Json::Null) {
        return fallback;
    }
    if (v->kind != Json::Str) {
        throw std::runtime_error(std::string("field '") + key + "' is not a string");
    }
    return v->str;
}

inline std::vector<int32_t> ints_field(const Json & req, const char * key) {
    const Json & a = field(req, key, Json::Arr);
    std::vector<int32_t> out;
    out.reserve(a.arr.size());
    for (const Json & v : a.arr) {
        if (v.kind != Json::Num || v.num != std::floor(v.num) || std::fabs(v.num) > 2147483647.0) {
            throw std::runtime_error(std::string("field '") + key + "' holds a non-integer");
        }
        out.push_back((int32_t) v.num);
    }
    return out;
}

// ---------------------------------------------------------------------------------------------
// Writing answers.

inline void json_str(std::string & out, const char * s) {
    out += '"';
    for (const char * p = s; *p; p++) {
        unsigned char c = (unsigned char) *p;
        if (c == '"' || c == '\\') {
            out += '\\';
            out += (char) c;
        } else if (c < 0x20) {
            char buf[8];
            snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
        } else {
            out += (char) c;
        }
    }
    out += '"';
}

inline void json_str(std::string & out, const std::string & s) { json_str(out, s.c_str()); }

inline void json_u64(std::string & out, uint64_t v) { out += std::to_string(v); }

inline void json_f32(std::string & out, float v) {
    if (!std::isfinite(v)) {
        out += "null";
        return;
    }
    char buf[32];
#if defined(__cpp_lib_to_chars) && __cpp_lib_to_chars >= 201611L
    // the shortest text that reads back as the same float, several times faster than printf
    // (a chunk's every logit of a large vocabulary is tens of millions of values)
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, r.ptr);
#else
    snprintf(buf, sizeof buf, "%.9g", (double) v);
    out += buf;
#endif
}

// ---------------------------------------------------------------------------------------------
// llama.cpp's log: kept in a ring (the last lines go into error answers), printed when verbose.

inline std::deque<std::string> g_log;
inline bool g_verbose = false;

inline void log_cb(ggml_log_level level, const char * text, void * /*user*/) {
    (void) level;
    if (g_verbose) {
        fputs(text, stderr);
    }
    if (g_log.empty() || (!g_log.back().empty() && g_log.back().back() == '\n')) {
        g_log.emplace_back();
    }
    g_log.back() += text;
    while (g_log.size() > 16) {
        g_log.pop_front();
    }
}

inline std::string log_tail(size_t n) {
    std::string out;
    size_t start = g_log.size() > n ? g_log.size() - n : 0;
    for (size_t k = start; k < g_log.size(); k++) {
        std::string line = g_log[k];
        while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) {
            line.pop_back();
        }
        if (line.empty()) {
            continue;
        }
        if (!out.empty()) {
            out += " | ";
        }
        out += line;
    }
    return out.empty() ? "llama.cpp said nothing" : out;
}

// ---------------------------------------------------------------------------------------------
// The instrument (the eval callback).

enum class Observe { Count, Capture, Timed, Replay };

// In-graph replay (replay.cpp): the plan and resources of one replay request. The instrument
// asks it at each node in Replay mode.
struct Replayer;
bool replay_ask(Replayer & r, uint32_t index);
bool replay_observe(Replayer & r, uint32_t index, ggml_tensor * t);
// Capture mode: what a replay's scratch buffer on the node's device must hold.
void replay_note_scratch(std::vector<std::pair<ggml_backend_dev_t, size_t>> & need, const ggml_tensor * t);
// calibrate.cpp: the threads ggml's CPU plan gives a graph of this node alone (64 available).
int cpu_plan_threads(const ggml_tensor * t);

inline uint64_t now_ns() {
    return (uint64_t) std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// The buffer holding a tensor's memory (its view source's when it has none).
inline ggml_backend_buffer_t buffer_of(const ggml_tensor * t) {
    return (t->buffer == nullptr && t->view_src != nullptr) ? t->view_src->buffer : t->buffer;
}

inline ggml_backend_dev_t device_of(const ggml_tensor * t) {
    ggml_backend_buffer_t buf = buffer_of(t);
    ggml_backend_buffer_type_t buft = buf ? ggml_backend_buffer_get_type(buf) : nullptr;
    ggml_backend_dev_t dev = buft ? ggml_backend_buft_get_device(buft) : nullptr;
    // a device's pinned host memory (CUDA_Host, Vulkan_Host: llama.cpp gives the CPU backend
    // the first GPU's host buffer type for its compute buffer, so that copies to the device are
    // fast) is the CPU's: the scheduler computes what lives there on the CPU backend, and its
    // copies to the device are transfers
    if (dev != nullptr && ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU &&
        ggml_backend_dev_host_buffer_type(dev) == buft) {
        ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        if (cpu != nullptr) {
            return cpu;
        }
    }
    return dev;
}

inline const char * device_name(const ggml_tensor * t) {
    ggml_backend_buffer_t buf = buffer_of(t);
    if (buf == nullptr) {
        return nullptr;
    }
    ggml_backend_dev_t dev = device_of(t);
    if (dev == nullptr) {
        return ggml_backend_buffer_name(buf);
    }
    return ggml_backend_dev_name(dev);
}

// Whether a tensor lives on a device of ggml's RPC backend, whose "synchronize" waits for the
// send only (a graph is computed without an answer): its end is waited for by a read.
inline bool on_rpc_device(const ggml_tensor * t) {
    static ggml_backend_reg_t rpc = ggml_backend_reg_by_name("RPC");
    ggml_backend_buffer_t buf = buffer_of(t);
    if (rpc == nullptr || buf == nullptr || ggml_backend_buffer_is_host(buf)) {
        return false;
    }
    ggml_backend_dev_t dev = device_of(t);
    return dev != nullptr && ggml_backend_dev_backend_reg(dev) == rpc;
}

// Waits until the device holding t has done everything sent to it so far, by reading up to 4
// bytes of t through the backend (a server answers in order).
inline void fence(const ggml_tensor * t) {
    size_t n = std::min<size_t>(ggml_nbytes(t), 4);
    if (n == 0 || buffer_of(t) == nullptr) {
        return;
    }
    uint8_t out[4];
    ggml_backend_tensor_get(t, out, 0, n);
}

// The expert ids of MUL_MAT_ID node `index`, appended to `out` (optime.cpp).
void capture_expert_ids(const ggml_tensor * t, uint32_t index, std::string & out);

// The device's clock is on (ggml-vulkan's perf logger prints every graph's op times on
// stderr): the worker marks each decode's bounds and, in TIMED, each node's end on stderr too
// (PROTOCOL.md "The device's clock"), so opledger can tell which lines belong to which node.
inline bool device_clock_marks() {
    static const bool on = getenv("GGML_VK_PERF_LOGGER") != nullptr;
    return on;
}

struct Observer {
    Observe mode = Observe::Count;
    bool capture_ids = false;  // timed: keep each MUL_MAT_ID node's expert ids
    std::string ids;           // the ids kept, as JSON objects, comma-separated
    uint32_t nodes_seen = 0;
    std::vector<uint64_t> timed_ns;
    std::vector<uint64_t> gap_ns;
    std::vector<int> ops;
    std::unordered_map<const ggml_tensor *, uint32_t> producers;
    std::string captured;  // the nodes as JSON objects, comma-separated
    uint64_t t_ask = 0;
    uint64_t last_end = 0;
    ggml_backend_dev_t last_device = nullptr;
    // Replay mode: the request's plan and resources (set by op_replay for one decode)
    Replayer * replayer = nullptr;
    // the last capture: the largest node output per computing device (replay scratch sizes)
    std::vector<std::pair<ggml_backend_dev_t, size_t>> scratch_need;

    void reset(Observe m) {
        mode = m;
        nodes_seen = 0;
        timed_ns.clear();
        gap_ns.clear();
        ops.clear();
        producers.clear();
        captured.clear();
        capture_ids = false;
        ids.clear();
        t_ask = 0;
        last_end = 0;
        last_device = nullptr;
        if (m == Observe::Capture) {
            scratch_need.clear();
        }
    }

    void tensor(std::string & out, const ggml_tensor * t) const {
        out += "{\"name\":";
        json_str(out, t->name);
        out += ",\"ne\":[";
        for (int k = 0; k < 4; k++) {
            out += (k ? "," : "") + std::to_string(t->ne[k]);
        }
        out += "],\"nb\":[";
        for (int k = 0; k < 4; k++) {
            out += (k ? "," : "") + std::to_string(t->nb[k]);
        }
        out += "],\"type\":";
        json_str(out, ggml_type_name(t->type));
        out += ",\"bytes\":";
        json_u64(out, (uint64_t) ggml_nbytes(t));
        bool weight = t->buffer != nullptr &&
                      ggml_backend_buffer_get_usage(t->buffer) == GGML_BACKEND_BUFFER_USAGE_WEIGHTS;
        out += weight ? ",\"weight\":true" : ",\"weight\":false";
        auto it = producers.find(t);
        if (it != producers.end()) {
            out += ",\"producer\":" + std::to_string(it->second);
        }
        out += "}";
    }

    void capture(const ggml_tensor * t, uint32_t index) {
        std::string & out = captured;
        if (!out.empty()) {
            out += ",";
        }
        out += "{\"op\":";
        json_str(out, ggml_op_desc(t));
        out += ",\"code\":" + std::to_string((int) t->op);
        out += ",\"out\":";
        tensor(out, t);
        out += ",\"srcs\":[";
        int last = -1;
        for (int k = 0; k < GGML_MAX_SRC; k++) {
            if (t->src[k] != nullptr) {
                last = k;
            }
        }
        for (int k = 0; k <= last; k++) {
            if (k) {
                out += ",";
            }
            if (t->src[k] == nullptr) {
                out += "null";
            } else {
                tensor(out, t->src[k]);
            }
        }
        out += "],\"view_src\":";
        out += t->view_src != nullptr ? "true" : "false";
#ifdef OPLEDGER_WORKER_HAS_FLAG_COMPUTE
        out += (t->flags & GGML_TENSOR_FLAG_COMPUTE) ? ",\"compute\":true" : ",\"compute\":false";
#else
        out += ",\"compute\":true";
#endif
        out += ",\"params\":[";
        int n = GGML_MAX_OP_PARAMS / (int) sizeof(int32_t);
        while (n > 0 && t->op_params[n - 1] == 0) {
            n--;
        }
        for (int k = 0; k < n; k++) {
            out += (k ? "," : "") + std::to_string(t->op_params[k]);
        }
        out += "],\"threads\":" + std::to_string(cpu_plan_threads(t));
        replay_note_scratch(scratch_need, t);
        out += ",\"device\":";
        const char * dev = device_name(t);
        if (dev) {
            json_str(out, dev);
        } else {
            out += "null";
        }
        out += "}";
        producers[t] = index;
    }

    bool on_eval(ggml_tensor * t, bool ask) {
        switch (mode) {
            case Observe::Count:
                if (ask) {
                    nodes_seen++;
                    return false;
                }
                return true;
            case Observe::Capture:
                if (ask) {
                    capture(t, nodes_seen);
                    ops.push_back((int) t->op);
                    nodes_seen++;
                    return false;
                }
                return true;
            case Observe::Timed:
                if (ask) {
                    nodes_seen++;
                    // the first node of a split on an RPC device: its inputs were sent without
                    // an answer; wait for them to land, so that the copy is the gap before the
                    // node and not inside it
                    ggml_backend_dev_t dev = device_of(t);
                    if (dev != last_device && on_rpc_device(t)) {
                        fence(t);
                    }
                    last_device = dev;
                    uint64_t now = now_ns();
                    gap_ns.push_back(last_end ? now - last_end : 0);
                    t_ask = now;
                    return true;
                } else {
                    // the scheduler synchronised the node's backend before this call; an RPC
                    // device's synchronisation does not wait for the computation
                    if (on_rpc_device(t)) {
                        fence(t);
                    }
                    uint64_t now = now_ns();
                    timed_ns.push_back(t_ask ? now - t_ask : 0);
                    t_ask = 0;
                    if (device_clock_marks()) {
                        // after the clock stopped: the backend printed this node's device time
                        // (if it timed any) inside the node's compute, before this call
                        fprintf(stderr, "opledger-device-clock node %zu\n", timed_ns.size() - 1);
                        fflush(stderr);
                    }
                    last_end = now;
                    ops.push_back((int) t->op);
                    if (capture_ids && t->op == GGML_OP_MUL_MAT_ID) {
                        capture_expert_ids(t, (uint32_t) (timed_ns.size() - 1), ids);
                    }
                    return true;
                }
            case Observe::Replay:
                if (ask) {
                    return replay_ask(*replayer, nodes_seen++);
                }
                return replay_observe(*replayer, nodes_seen - 1, t);
        }
        return true;
    }
};

// ---------------------------------------------------------------------------------------------
// A model split over RPC servers (remote.cpp; PROTOCOL.md, "Faults"): a remote device that fails
// ends the worker with exit status REMOTE_FAILED_STATUS and one clear last line on stderr,
// whether ggml's RPC client aborts (a closed connection, a malformed answer) or a watchdog
// finds that a request made no progress for the RPC timeout (a server that stopped answering).

constexpr int REMOTE_FAILED_STATUS = 7;

// Starts watching (once per process; later calls change the timeout) and routes ggml's aborts
// inside its RPC client to the remote-failure exit.
void remote_watch(int64_t timeout_ms);
// Watches the request being handled (on) or stops watching (between requests); nothing when
// remote_watch was never called.
void remote_arm(bool on);
// Progress: a node asked about, a batch decoded, the load's progress.
void remote_tick();

inline bool eval_cb(ggml_tensor * t, bool ask, void * user) {
    if (t == nullptr || user == nullptr) {
        return false;
    }
    if (ask) {
        // before the node's clock starts: the tick lands in the gap, never in a node's time
        remote_tick();
    }
    return static_cast<Observer *>(user)->on_eval(t, ask);
}

inline bool abort_cb(void * data) { return data != nullptr && *static_cast<bool *>(data); }

// ---------------------------------------------------------------------------------------------
// The worker's state: one model, one thread pool, two contexts (plain: no callback; observed:
// the instrument), one saved state per context.

struct Ctx {
    llama_context * ctx = nullptr;
    std::unique_ptr<Observer> obs;
    std::unique_ptr<bool> abort_flag;
    std::vector<uint8_t> state;
    bool state_full = false;
    bool has_state = false;
    uint32_t n_batch = 0;
};

struct Worker {
    llama_model * model = nullptr;
    // in-graph replay's backends and scratch buffers, kept between requests (replay.cpp)
    std::shared_ptr<Replayer> replayer;
    ggml_threadpool * pool = nullptr;
    int threads = 0;
    Ctx plain;
    Ctx observed;
    int32_t n_vocab = 0;

    ~Worker() {
        replayer.reset();
        free_contexts();
        if (model) {
            llama_model_free(model);
        }
        if (pool) {
            ggml_threadpool_free(pool);
        }
    }

    void free_ctx(Ctx & c) {
        if (c.ctx) {
            llama_detach_threadpool(c.ctx);
            llama_free(c.ctx);
            c.ctx = nullptr;
        }
        c.obs.reset();
        c.abort_flag.reset();
        c.state.clear();
        c.has_state = false;
    }

    void free_contexts() {
        free_ctx(plain);
        free_ctx(observed);
    }

    Ctx & pick(const Json & req) {
        std::string name = str_field(req, "ctx", "");
        Ctx * c = name == "plain" ? &plain : name == "observed" ? &observed : nullptr;
        if (c == nullptr) {
            throw std::runtime_error("field 'ctx' must be \"plain\" or \"observed\"");
        }
        if (c->ctx == nullptr) {
            throw std::runtime_error("no contexts: send 'contexts' first");
        }
        return *c;
    }

    void pause() {
        if (pool) {
            ggml_threadpool_pause(pool);
        }
    }
};

inline ggml_type kv_type(const std::string & s) {
    static const std::pair<const char *, ggml_type> types[] = {
        {"f32", GGML_TYPE_F32},   {"f16", GGML_TYPE_F16},   {"bf16", GGML_TYPE_BF16},
        {"q8_0", GGML_TYPE_Q8_0}, {"q4_0", GGML_TYPE_Q4_0}, {"q4_1", GGML_TYPE_Q4_1},
        {"q5_0", GGML_TYPE_Q5_0}, {"q5_1", GGML_TYPE_Q5_1},
    };
    for (const auto & t : types) {
        if (s == t.first) {
            return t.second;
        }
    }
    throw std::runtime_error("unknown KV cache type '" + s + "'");
}

// FNV-1a over the bit patterns of a row of logits, little-endian bytes (opledger's hash_f32).
inline uint64_t hash_row(const float * v, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t k = 0; k < n; k++) {
        uint32_t bits;
        memcpy(&bits, &v[k], 4);
        for (int b = 0; b < 4; b++) {
            h ^= (bits >> (8 * b)) & 0xFF;
            h *= 0x100000001b3ULL;
        }
    }
    return h;
}


// Requests served outside worker.cpp.
void op_decode(Worker & w, const Json & req, std::string & out, bool step);
void op_replay(Worker & w, const Json & req, std::string & out);
void op_calibrate(Worker & w, const Json & req, std::string & out);
