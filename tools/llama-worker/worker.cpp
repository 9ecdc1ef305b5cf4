// opledger-llama-worker: the measurement worker opledger drives over a channel of its own,
// compiled in the user's own llama.cpp tree. It loads, captures, runs, times and hashes; it never bands,
// summarises or judges (that is opledger's). The protocol is PROTOCOL.md beside this file.
//
// Only llama.cpp's public headers are used (llama.h, which brings ggml.h, ggml-cpu.h and
// ggml-backend.h). Tensors on a device are read through ggml_backend_tensor_get only (a
// device buffer is not host memory); logits through llama_get_logits_ith (host copies).

#include "optime.h"
#include "worker.h"
#include "rpc_server.h"

#include <cerrno>
#include <csignal>
#include <fcntl.h>
#include <unistd.h>

#if !defined(_WIN32)
extern char ** environ;
#endif

#ifndef OPLEDGER_WORKER_LLAMA_COMMIT
#define OPLEDGER_WORKER_LLAMA_COMMIT "unknown"
#endif
#ifndef OPLEDGER_WORKER_LLAMA_BUILD
#define OPLEDGER_WORKER_LLAMA_BUILD "unknown"
#endif
#ifndef OPLEDGER_WORKER_BUILD_OPTIONS
#define OPLEDGER_WORKER_BUILD_OPTIONS ""
#endif

static const int PROTOCOL_VERSION = 4;

// ---------------------------------------------------------------------------------------------
// Requests.

static void devices_json(std::string & out, const std::vector<ggml_backend_dev_t> & more = {});

static std::string hello() {
    std::string out = "{\"protocol\":\"opledger-llama-worker\",\"version\":";
    out += std::to_string(PROTOCOL_VERSION);
    out += ",\"llama\":{\"commit\":";
    json_str(out, OPLEDGER_WORKER_LLAMA_COMMIT);
    out += ",\"build\":";
    json_str(out, OPLEDGER_WORKER_LLAMA_BUILD);
    out += ",\"ggml_version\":";
    json_str(out, ggml_version());
    out += ",\"ggml_commit\":";
    json_str(out, ggml_commit());
    out += ",\"compiler\":";
#if defined(__clang__)
    json_str(out, std::string("clang ") + __clang_version__);
#elif defined(__GNUC__)
    json_str(out, std::string("gcc ") + __VERSION__);
#else
    json_str(out, "unknown");
#endif
    out += ",\"build_options\":";
    json_str(out, OPLEDGER_WORKER_BUILD_OPTIONS);
    out += ",\"system_info\":";
    json_str(out, llama_print_system_info());
    out += ",\"backends\":[";
    for (size_t k = 0; k < ggml_backend_reg_count(); k++) {
        out += k ? "," : "";
        json_str(out, ggml_backend_reg_name(ggml_backend_reg_get(k)));
    }
    out += "],\"devices\":";
    devices_json(out);
    // the environment the backends read their runtime switches from (GGML_CUDA_DISABLE_GRAPHS,
    // CUDA_VISIBLE_DEVICES, ...), sorted by name
    out += ",\"env\":{";
    std::map<std::string, std::string> env;
#if !defined(_WIN32)
    for (char ** e = environ; e != nullptr && *e != nullptr; e++) {
        std::string kv(*e);
        size_t eq = kv.find('=');
        if (eq == std::string::npos) {
            continue;
        }
        std::string name = kv.substr(0, eq);
        if (name.rfind("GGML_", 0) == 0 || name.rfind("CUDA_", 0) == 0 || name.rfind("LLAMA_", 0) == 0) {
            env[name] = kv.substr(eq + 1);
        }
    }
#endif
    bool first = true;
    for (const auto & kv : env) {
        out += first ? "" : ",";
        first = false;
        json_str(out, kv.first);
        out += ":";
        json_str(out, kv.second);
    }
    out += "}}}";
    return out;
}

// ggml's registered devices and `more` (RPC servers' devices, which ggml does not register),
// as the hello and `load` list them.
static void devices_json(std::string & out, const std::vector<ggml_backend_dev_t> & more) {
    std::vector<ggml_backend_dev_t> all;
    for (size_t k = 0; k < ggml_backend_dev_count(); k++) {
        all.push_back(ggml_backend_dev_get(k));
    }
    for (ggml_backend_dev_t d : more) {
        if (d != nullptr) {
            all.push_back(d);
        }
    }
    out += "[";
    for (size_t k = 0; k < all.size(); k++) {
        ggml_backend_dev_t d = all[k];
        size_t free_b = 0, total_b = 0;
        ggml_backend_dev_memory(d, &free_b, &total_b);
        const char * kind = "cpu";
        switch (ggml_backend_dev_type(d)) {
            case GGML_BACKEND_DEVICE_TYPE_CPU: kind = "cpu"; break;
            case GGML_BACKEND_DEVICE_TYPE_GPU: kind = "gpu"; break;
            default: kind = "other"; break;
        }
        out += k ? "," : "";
        out += "{\"name\":";
        json_str(out, ggml_backend_dev_name(d));
        out += ",\"description\":";
        json_str(out, ggml_backend_dev_description(d));
        out += ",\"type\":";
        json_str(out, kind);
        out += ",\"memory_total\":";
        json_u64(out, total_b);
        out += ",\"memory_free\":";
        json_u64(out, free_b);
        out += "}";
    }
    out += "]";
}

static void op_load(Worker & w, const Json & req, std::string & out) {
    if (w.model) {
        throw std::runtime_error("a model is already loaded");
    }
    std::string path = field(req, "model", Json::Str).str;
    int64_t threads = int_field(req, "threads");
    if (threads < 1 || threads > 4096) {
        throw std::runtime_error("field 'threads' must be 1 to 4096");
    }
    llama_model_params p = llama_model_default_params();
    p.n_gpu_layers = (int32_t) int_field(req, "gpu_layers");
    if (bool_field(req, "no_repack", false)) {
        p.use_extra_bufts = false;
    }
    // RPC servers: the first device of each, in order, and the layer proportions per device
    // (llama.cpp's tensor_split, llama_max_devices() values); opledger computes both
    std::vector<ggml_backend_dev_t> devices;
    std::vector<float> split;
    const Json * rpc = req.get("rpc");
    if (rpc != nullptr && rpc->kind != Json::Null) {
        if (rpc->kind != Json::Arr || rpc->arr.empty()) {
            throw std::runtime_error("field 'rpc' is not a list of servers");
        }
        // a remote device failing from here on ends the worker clearly (remote.cpp)
        const Json * rt = req.get("rpc_timeout_ms");
        if (rt != nullptr && rt->kind != Json::Null) {
            int64_t ms = int_field(req, "rpc_timeout_ms");
            if (ms < 1) {
                throw std::runtime_error("field 'rpc_timeout_ms' must be at least 1");
            }
            remote_watch(ms);
            remote_arm(true);
            p.progress_callback = [](float, void *) {
                remote_tick();
                return true;
            };
        }
        ggml_backend_reg_t reg = ggml_backend_reg_by_name("RPC");
        if (reg == nullptr) {
            throw std::runtime_error("this llama.cpp was built without its RPC backend (configure it with -DGGML_RPC=ON)");
        }
        typedef ggml_backend_reg_t (*add_server_fn)(const char *);
        add_server_fn add = (add_server_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_rpc_add_server");
        if (add == nullptr) {
            throw std::runtime_error("ggml's RPC backend does not export ggml_backend_rpc_add_server");
        }
        for (const Json & e : rpc->arr) {
            if (e.kind != Json::Str) {
                throw std::runtime_error("field 'rpc' holds a non-string");
            }
            ggml_backend_reg_t server = add(e.str.c_str());
            ggml_backend_dev_t dev = server ? ggml_backend_reg_dev_get(server, 0) : nullptr;
            if (dev == nullptr) {
                throw std::runtime_error("ggml could not add the RPC server " + e.str + " (" + log_tail(2) + ")");
            }
            devices.push_back(dev);
        }
        devices.push_back(nullptr);
        const Json & ts = field(req, "tensor_split", Json::Arr);
        if (ts.arr.size() > llama_max_devices()) {
            throw std::runtime_error("field 'tensor_split' has more values than this llama.cpp's " +
                                     std::to_string(llama_max_devices()) + " devices");
        }
        split.assign(llama_max_devices(), 0.0f);
        for (size_t k = 0; k < ts.arr.size(); k++) {
            if (ts.arr[k].kind != Json::Num) {
                throw std::runtime_error("field 'tensor_split' holds a non-number");
            }
            split[k] = (float) ts.arr[k].num;
        }
        p.devices = devices.data();
        p.split_mode = LLAMA_SPLIT_MODE_LAYER;
        p.tensor_split = split.data();
    }
    uint64_t t0 = now_ns();
    w.model = llama_model_load_from_file(path.c_str(), p);
    if (w.model == nullptr) {
        throw std::runtime_error("llama.cpp refused the model '" + path + "' (" + log_tail(3) + ")");
    }
    double load_ms = (double) (now_ns() - t0) / 1e6;
    ggml_threadpool_params tp = ggml_threadpool_params_default((int) threads);
    w.pool = ggml_threadpool_new(&tp);
    if (w.pool == nullptr) {
        throw std::runtime_error("ggml could not create a thread pool of " +
                                 std::to_string(threads) + " threads");
    }
    w.threads = (int) threads;
    w.n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(w.model));
    char desc[256] = {0};
    llama_model_desc(w.model, desc, sizeof desc);
    out += ",\"n_vocab\":" + std::to_string(w.n_vocab);
    out += ",\"n_layer\":" + std::to_string(llama_model_n_layer(w.model));
    out += ",\"description\":";
    json_str(out, desc);
    char ms[32];
    snprintf(ms, sizeof ms, "%.3f", load_ms);
    out += ",\"load_ms\":";
    out += ms;
    out += ",\"devices\":";
    devices_json(out, devices);
}

static void make_ctx(Worker & w, Ctx & c, const Json & req, bool instrumented) {
    llama_context_params p = llama_context_default_params();
    p.n_ctx = (uint32_t) int_field(req, "n_ctx");
    p.n_batch = (uint32_t) int_field(req, "n_batch");
    p.n_ubatch = (uint32_t) int_field(req, "n_ubatch");
    p.n_seq_max = (uint32_t) int_field(req, "n_seq_max");
    p.kv_unified = bool_field(req, "kv_unified", false);
    // llama.cpp's own tools keep a sliding-window cache of the window plus one batch
    p.swa_full = false;
    std::string fa = str_field(req, "flash_attn", "auto");
    if (fa == "auto") {
        p.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_AUTO;
    } else if (fa == "on") {
        p.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    } else if (fa == "off") {
        p.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    } else {
        throw std::runtime_error("field 'flash_attn' must be auto, on or off");
    }
    std::string tk = str_field(req, "type_k", "");
    std::string tv = str_field(req, "type_v", "");
    if (!tk.empty()) {
        p.type_k = kv_type(tk);
    }
    if (!tv.empty()) {
        p.type_v = kv_type(tv);
    }
    p.n_threads = w.threads;
    p.n_threads_batch = w.threads;
    p.no_perf = true;
    if (instrumented) {
        c.obs.reset(new Observer());
        p.cb_eval = eval_cb;
        p.cb_eval_user_data = c.obs.get();
    }
    c.ctx = llama_init_from_model(w.model, p);
    if (c.ctx == nullptr) {
        c.obs.reset();
        throw std::runtime_error("llama.cpp could not create a context (" + log_tail(3) + ")");
    }
    llama_attach_threadpool(c.ctx, w.pool, w.pool);
    c.abort_flag.reset(new bool(false));
    llama_set_abort_callback(c.ctx, abort_cb, c.abort_flag.get());
    c.n_batch = p.n_batch;
}

static void op_contexts(Worker & w, const Json & req, std::string & out) {
    if (!w.model) {
        throw std::runtime_error("no model: send 'load' first");
    }
    w.free_contexts();
    make_ctx(w, w.plain, req, false);
    make_ctx(w, w.observed, req, true);
    out += ",\"n_ctx\":" + std::to_string(llama_n_ctx(w.observed.ctx));
}

static Observe observe_of(const std::string & s) {
    if (s == "count") {
        return Observe::Count;
    }
    if (s == "capture") {
        return Observe::Capture;
    }
    if (s == "timed") {
        return Observe::Timed;
    }
    if (s == "replay") {
        return Observe::Replay;
    }
    throw std::runtime_error("field 'observe' must be count, capture or timed");
}

// One llama_decode of `entries` (token, pos, seq, logits); the wall of the call and its
// synchronisation is added to wall_ns. Returns llama_decode's code.
static int decode_batch(Ctx & c, const std::vector<int32_t> & tokens, const std::vector<int32_t> & pos,
                        const std::vector<int32_t> & seq, const std::vector<int8_t> & logits,
                        uint64_t & wall_ns, uint64_t & end_ns) {
    int n = (int) tokens.size();
    llama_batch b = llama_batch_init(n, 0, 1);
    for (int k = 0; k < n; k++) {
        b.token[k] = tokens[k];
        b.pos[k] = pos[k];
        b.n_seq_id[k] = 1;
        b.seq_id[k][0] = seq[k];
        b.logits[k] = logits[k];
    }
    b.n_tokens = n;
    remote_tick();
    uint64_t t0 = now_ns();
    int code = llama_decode(c.ctx, b);
    llama_synchronize(c.ctx);
    end_ns = now_ns();
    remote_tick();
    wall_ns += end_ns - t0;
    llama_batch_free(b);
    return code;
}

// "decode": sequence 0, tokens at pos0.., in batches of n_batch; logits of the last token or of
// every token. "step": one token per sequence first_seq.. at one position, logits for each.
void op_decode(Worker & w, const Json & req, std::string & out, bool step) {
    Ctx & c = w.pick(req);
    std::vector<int32_t> tokens = ints_field(req, "tokens");
    if (tokens.empty()) {
        throw std::runtime_error("an empty batch");
    }
    for (int32_t t : tokens) {
        if (t < 0 || t >= w.n_vocab) {
            throw std::runtime_error("token " + std::to_string(t) + " lies outside the vocabulary of " +
                                     std::to_string(w.n_vocab));
        }
    }
    std::string observe = str_field(req, "observe", "none");
    bool abort_first = bool_field(req, "abort_after_first", false);
    bool capture_ids = bool_field(req, "capture_ids", false);
    if (capture_ids && observe != "timed") {
        throw std::runtime_error("field 'capture_ids' needs observe 'timed'");
    }
    if (observe != "none") {
        if (!c.obs) {
            throw std::runtime_error("the plain context has no instrument");
        }
        c.obs->reset(observe_of(observe));
        c.obs->capture_ids = capture_ids;
        if (c.obs->mode == Observe::Replay && c.obs->replayer == nullptr) {
            throw std::runtime_error("observe 'replay' belongs to the 'replay' request");
        }
    } else if (c.obs) {
        c.obs->reset(Observe::Count);
    }
    *c.abort_flag = abort_first;
    // the device's clock (PROTOCOL.md): the run's bounds on stderr, where the backend prints it
    const bool marks = device_clock_marks();
    const uint64_t id = (uint64_t) int_field(req, "id");
    if (marks) {
        fprintf(stderr, "opledger-device-clock begin %llu\n", (unsigned long long) id);
        fflush(stderr);
    }
    uint64_t wall_ns = 0;
    uint64_t end_ns = 0;
    int code = 0;
    int rows = 0;
    if (step) {
        int64_t pos = int_field(req, "pos");
        int64_t first_seq = int_field(req, "first_seq");
        std::vector<int32_t> p(tokens.size(), (int32_t) pos), s(tokens.size());
        std::vector<int8_t> l(tokens.size(), 1);
        for (size_t k = 0; k < tokens.size(); k++) {
            s[k] = (int32_t) (first_seq + (int64_t) k);
        }
        code = decode_batch(c, tokens, p, s, l, wall_ns, end_ns);
        rows = (int) tokens.size();
    } else {
        int64_t pos0 = int_field(req, "pos0");
        bool all = bool_field(req, "all_logits", false);
        bool none = bool_field(req, "no_logits", false);
        size_t nb = c.n_batch ? c.n_batch : tokens.size();
        for (size_t start = 0; start < tokens.size() && code == 0; start += nb) {
            size_t n = std::min(nb, tokens.size() - start);
            std::vector<int32_t> t(tokens.begin() + start, tokens.begin() + start + n), p(n), s(n, 0);
            std::vector<int8_t> l(n, 0);
            bool last_part = start + n == tokens.size();
            for (size_t k = 0; k < n; k++) {
                p[k] = (int32_t) (pos0 + (int64_t) (start + k));
                l[k] = !none && (all || (last_part && k + 1 == n));
            }
            code = decode_batch(c, t, p, s, l, wall_ns, end_ns);
            rows = none ? 0 : all ? (int) n : 1;
        }
    }
    *c.abort_flag = false;
    if (marks) {
        fprintf(stderr, "opledger-device-clock end %llu\n", (unsigned long long) id);
        fflush(stderr);
    }
    w.pause();
    if (code == 2 && abort_first) {
        out += ",\"aborted\":true";
    } else if (code != 0) {
        throw std::runtime_error("llama_decode returned " + std::to_string(code) + " (" + log_tail(2) + ")");
    }
    out += ",\"wall_ns\":";
    json_u64(out, wall_ns);
    // the requested rows: hashed, and counted where not finite
    out += ",\"row_hashes\":[";
    uint64_t non_finite = 0, values = 0;
    if (code == 0) {
        for (int r = 0; r < rows; r++) {
            int idx = step ? r : (rows == 1 ? -1 : r);
            const float * row = llama_get_logits_ith(c.ctx, idx);
            if (row == nullptr) {
                throw std::runtime_error("no logits for output row " + std::to_string(idx));
            }
            for (int32_t k = 0; k < w.n_vocab; k++) {
                non_finite += !std::isfinite(row[k]);
            }
            values += (uint64_t) w.n_vocab;
            out += r ? "," : "";
            json_u64(out, hash_row(row, (size_t) w.n_vocab));
        }
    }
    out += "],\"non_finite\":";
    json_u64(out, non_finite);
    out += ",\"values\":";
    json_u64(out, values);
    if (c.obs) {
        Observer & o = *c.obs;
        out += ",\"nodes_seen\":" + std::to_string(o.nodes_seen);
        if (o.mode == Observe::Timed) {
            out += ",\"node_ns\":[";
            for (size_t k = 0; k < o.timed_ns.size(); k++) {
                out += k ? "," : "";
                json_u64(out, o.timed_ns[k]);
            }
            out += "],\"gap_ns\":[";
            for (size_t k = 0; k < o.gap_ns.size(); k++) {
                out += k ? "," : "";
                json_u64(out, o.gap_ns[k]);
            }
            // from the last node's end to the end of the decode (outputs read back)
            out += "],\"tail_ns\":";
            json_u64(out, o.last_end && end_ns > o.last_end ? end_ns - o.last_end : 0);
        }
        if (o.mode == Observe::Capture || o.mode == Observe::Timed) {
            out += ",\"ops\":[";
            for (size_t k = 0; k < o.ops.size(); k++) {
                out += (k ? "," : "") + std::to_string(o.ops[k]);
            }
            out += "]";
        }
        if (o.capture_ids) {
            out += ",\"ids\":[" + o.ids + "]";
        }
        if (o.mode == Observe::Capture) {
            out += ",\"nodes\":[" + o.captured + "]";
            o.captured.clear();
            o.producers.clear();
        }
    }
}

static void op_state(Worker & w, const Json & req, std::string & out, bool save) {
    Ctx & c = w.pick(req);
    std::string scope = str_field(req, "scope", "");
    if (scope != "seq0" && scope != "full") {
        throw std::runtime_error("field 'scope' must be seq0 or full");
    }
    bool full = scope == "full";
    if (save) {
        size_t size = full ? llama_state_get_size(c.ctx) : llama_state_seq_get_size(c.ctx, 0);
        c.state.assign(size, 0);
        size_t written = full ? llama_state_get_data(c.ctx, c.state.data(), size)
                              : llama_state_seq_get_data(c.ctx, c.state.data(), size, 0);
        if (written != size) {
            throw std::runtime_error("wrote " + std::to_string(written) + " of " + std::to_string(size) +
                                     " bytes of state");
        }
        c.state_full = full;
        c.has_state = true;
        out += ",\"bytes\":" + std::to_string(size);
        return;
    }
    // restore: from this context's saved state, or the other context's ("from")
    std::string from = str_field(req, "from", "");
    Ctx * src = &c;
    if (from == "plain") {
        src = &w.plain;
    } else if (from == "observed") {
        src = &w.observed;
    } else if (!from.empty()) {
        throw std::runtime_error("field 'from' must be plain or observed");
    }
    if (!src->has_state || src->state_full != full) {
        throw std::runtime_error("no saved " + scope + " state to restore");
    }
    llama_memory_clear(llama_get_memory(c.ctx), true);
    if (src->state.empty()) {
        return;
    }
    size_t read = full ? llama_state_set_data(c.ctx, src->state.data(), src->state.size())
                       : llama_state_seq_set_data(c.ctx, src->state.data(), src->state.size(), 0);
    if (read == 0) {
        throw std::runtime_error("llama.cpp refused the saved state (" + log_tail(2) + ")");
    }
}

static void op_logits(Worker & w, const Json & req, std::string & out) {
    Ctx & c = w.pick(req);
    std::vector<int32_t> rows = ints_field(req, "rows");
    out += ",\"rows\":[";
    for (size_t r = 0; r < rows.size(); r++) {
        const float * row = llama_get_logits_ith(c.ctx, rows[r]);
        if (row == nullptr) {
            throw std::runtime_error("no logits for output row " + std::to_string(rows[r]));
        }
        out += r ? ",[" : "[";
        for (int32_t k = 0; k < w.n_vocab; k++) {
            if (k) {
                out += ",";
            }
            json_f32(out, row[k]);
        }
        out += "]";
    }
    out += "]";
}

static void handle(Worker & w, const Json & req, std::string & out) {
    std::string op = field(req, "op", Json::Str).str;
    if (op == "load") {
        op_load(w, req, out);
    } else if (op == "contexts") {
        op_contexts(w, req, out);
    } else if (op == "clear") {
        llama_memory_clear(llama_get_memory(w.pick(req).ctx), true);
    } else if (op == "decode") {
        op_decode(w, req, out, false);
    } else if (op == "step") {
        op_decode(w, req, out, true);
    } else if (op == "save") {
        op_state(w, req, out, true);
    } else if (op == "restore") {
        op_state(w, req, out, false);
    } else if (op == "seq_cp") {
        Ctx & c = w.pick(req);
        llama_memory_seq_cp(llama_get_memory(c.ctx), (llama_seq_id) int_field(req, "src"),
                            (llama_seq_id) int_field(req, "dst"), -1, -1);
    } else if (op == "seq_rm") {
        Ctx & c = w.pick(req);
        int64_t seq = int_field(req, "seq");
        if (!llama_memory_seq_rm(llama_get_memory(c.ctx), (llama_seq_id) seq, -1, -1)) {
            throw std::runtime_error("llama.cpp could not remove sequence " + std::to_string(seq));
        }
    } else if (op == "logits") {
        op_logits(w, req, out);
    } else if (op == "time_op") {
        op_time_op(w, req, out);
    } else if (op == "replay") {
        op_replay(w, req, out);
    } else if (op == "calibrate") {
        op_calibrate(w, req, out);
    } else {
        throw std::runtime_error("unknown op '" + op + "'");
    }
}

// ---------------------------------------------------------------------------------------------
// The channel: requests and answers travel on a file descriptor opledger hands the worker (one
// end of a Unix socket pair, `--channel-fd 3`), never on stdout or stdin, so that whatever
// llama.cpp, a backend or a stray printf writes to stdout or stderr cannot touch the protocol.

struct Channel {
    int fd = -1;
    std::string buf;  // bytes read and not yet returned as a line

    // The next line without its newline; false at the end of the stream or on an error.
    bool read_line(std::string & line) {
        for (;;) {
            size_t nl = buf.find('\n');
            if (nl != std::string::npos) {
                line.assign(buf, 0, nl);
                buf.erase(0, nl + 1);
                return true;
            }
            char chunk[65536];
            ssize_t n = read(fd, chunk, sizeof chunk);
            if (n < 0 && errno == EINTR) {
                continue;
            }
            if (n <= 0) {
                return false;
            }
            buf.append(chunk, (size_t) n);
        }
    }

    // Writes all of `s`; false when the channel is closed.
    bool write_all(const std::string & s) {
        size_t at = 0;
        while (at < s.size()) {
            ssize_t n = write(fd, s.data() + at, s.size() - at);
            if (n < 0 && errno == EINTR) {
                continue;
            }
            if (n <= 0) {
                return false;
            }
            at += (size_t) n;
        }
        return true;
    }
};

static int usage(const char * argv0, const char * why) {
    fprintf(stderr,
            "%s: %s\n"
            "usage: %s --channel-fd FD [--verbose]   (how opledger runs it: requests and answers on FD)\n"
            "       %s --hello                       (prints the hello line on stdout and exits)\n"
            "This worker is driven by opledger (opledger profile --llama-worker PATH); see PROTOCOL.md.\n",
            argv0, why, argv0, argv0);
    return 2;
}

int main(int argc, char ** argv) {
    // a closed socket (the channel, an RPC server or client gone) is an error of the write that
    // meets it (EPIPE), never a signal that ends the worker before ggml or the channel can say so
    signal(SIGPIPE, SIG_IGN);
    // `--rpc-server HOST:PORT [--threads N]`: serve this machine's CPU (rpc_server.cpp)
    if (argc >= 3 && strcmp(argv[1], "--rpc-server") == 0) {
        int threads = 1;
        if (argc == 5 && strcmp(argv[3], "--threads") == 0) {
            threads = atoi(argv[4]);
        } else if (argc != 3) {
            fprintf(stderr, "usage: %s --rpc-server HOST:PORT [--threads N]\n", argv[0]);
            return 2;
        }
        g_verbose = true;
        llama_log_set(log_cb, nullptr);
        ggml_backend_load_all();
        return serve_rpc(argv[2], threads);
    }
    bool hello_only = false;
    int channel_fd = -1;
    for (int k = 1; k < argc; k++) {
        if (strcmp(argv[k], "--verbose") == 0) {
            g_verbose = true;
        } else if (strcmp(argv[k], "--hello") == 0) {
            hello_only = true;
        } else if (strcmp(argv[k], "--channel-fd") == 0 && k + 1 < argc) {
            char * end = nullptr;
            long fd = strtol(argv[++k], &end, 10);
            if (end == argv[k] || *end != '\0' || fd < 0 || fd > 65535) {
                return usage(argv[0], "--channel-fd takes a file descriptor number");
            }
            channel_fd = (int) fd;
        } else {
            return usage(argv[0], (std::string("unknown argument '") + argv[k] + "'").c_str());
        }
    }
    if (!hello_only && channel_fd < 0) {
        return usage(argv[0], "no channel: it is run by opledger with --channel-fd, or with --hello");
    }
    if (!hello_only && fcntl(channel_fd, F_GETFD) < 0) {
        return usage(argv[0], ("--channel-fd " + std::to_string(channel_fd) + " is not an open file descriptor").c_str());
    }
    if (!hello_only) {
        // the channel is the worker's own: no process it starts inherits it
        fcntl(channel_fd, F_SETFD, FD_CLOEXEC);
    }
    llama_log_set(log_cb, nullptr);
    ggml_backend_load_all();
    llama_backend_init();
    if (hello_only) {
        // what a person reads
        std::string h = hello() + "\n";
        fwrite(h.data(), 1, h.size(), stdout);
        fflush(stdout);
        llama_backend_free();
        return 0;
    }
    Channel ch;
    ch.fd = channel_fd;
    if (!ch.write_all(hello() + "\n")) {
        llama_backend_free();
        return 1;
    }
    int status = 0;
    {
    Worker w;
    std::string line;
    while (ch.read_line(line)) {
        if (line.empty()) {
            continue;
        }
        std::string out = "{\"id\":";
        bool quit = false;
        try {
            Json req = parse_json(line);
            if (req.kind != Json::Obj) {
                throw std::runtime_error("a request is a JSON object");
            }
            out += std::to_string(int_field(req, "id"));
            out += ",\"ok\":true";
            std::string op = field(req, "op", Json::Str).str;
            if (op == "quit") {
                quit = true;
            } else {
                // over RPC servers, the watchdog watches the request (the op timer and the
                // calibration compute on this machine alone and report no progress)
                remote_arm(op != "time_op" && op != "calibrate");
                handle(w, req, out);
            }
        } catch (const std::exception & e) {
            // an error answer replaces whatever the request had written
            size_t id_end = out.find(",\"ok\"");
            std::string head = id_end == std::string::npos ? std::string("{\"id\":null") : out.substr(0, id_end);
            out = head + ",\"ok\":false,\"error\":";
            json_str(out, e.what());
        }
        remote_arm(false);
        out += "}\n";
        if (!ch.write_all(out)) {
            // opledger closed its end: nobody reads the answers
            status = 1;
            break;
        }
        if (quit) {
            break;
        }
    }
    }
    llama_backend_free();
    return status;
}
