// In-graph replay: during a decode on the observed context, the instrument answers "yes" to the
// ask of every node the plan cuts at, and at the observe call of every node it replays
// dispatches k clones of that node (same op, parameters, sources and strides; ggml's COMPUTE
// flag; the output in a scratch buffer) in rounds of at most CLONES_PER_ROUND clones, one graph
// per round, on a backend of the node's own device (ggml_backend_dev_init; the CPU's on the
// worker's thread pool), the scratch allocated from that device's buffer type. The clones read
// the graph's live tensors and write only scratch memory, so the decode's outputs stay as they
// were. The worker counts what it replayed, skipped and failed; opledger judges.

#include "worker.h"

static const uint32_t CLONES_PER_ROUND = 16;

// One device's replay resources.
struct ReplayDevice {
    ggml_backend_dev_t dev = nullptr;
    ggml_backend_t backend = nullptr;
    ggml_backend_buffer_t scratch = nullptr;
};

struct Replayer {
    std::vector<ReplayDevice> devices;
    ggml_context * ctx = nullptr;  // the clones' metadata, reset before every round
    // the plan, by node index in ask order
    std::vector<uint8_t> cut;
    std::vector<uint8_t> replay;
    uint32_t k = 0;
    bool launches = false;
    // the request's counts: clones (or launch rounds) computed, nodes not replayed, rounds
    // ggml failed to compute; the first reason for either of the last two
    uint32_t replayed = 0;
    uint32_t skipped = 0;
    uint32_t failed = 0;
    std::string problem;

    ~Replayer() {
        for (ReplayDevice & d : devices) {
            if (d.scratch) {
                ggml_backend_buffer_free(d.scratch);
            }
            if (d.backend) {
                ggml_backend_free(d.backend);
            }
        }
        if (ctx) {
            ggml_free(ctx);
        }
    }

    void skip(const ggml_tensor * t, const std::string & why) {
        skipped++;
        if (problem.empty()) {
            problem = std::string("node '") + t->name + "' (" + ggml_op_desc(t) + ") was not replayed: " + why;
        }
    }

    void fail(const ggml_tensor * t, const std::string & why) {
        failed++;
        if (problem.empty()) {
            problem = std::string("replaying node '") + t->name + "' (" + ggml_op_desc(t) + ") failed: " + why;
        }
    }
};

// The device whose backend computes t: the device of its buffer type, except a host buffer
// type without a device (ggml's plain CPU buffer type names none) and a device's host buffer
// type (pinned memory llama.cpp gives the CPU backend's compute buffer when a GPU is present),
// which the CPU computes in.
static ggml_backend_dev_t computing_device(const ggml_tensor * t) {
    ggml_backend_buffer_t buf = buffer_of(t);
    ggml_backend_buffer_type_t buft = buf ? ggml_backend_buffer_get_type(buf) : nullptr;
    ggml_backend_dev_t dev = buft ? ggml_backend_buft_get_device(buft) : nullptr;
    if (dev == nullptr && buf != nullptr && ggml_backend_buffer_is_host(buf)) {
        return ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    }
    if (dev != nullptr && ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU &&
        ggml_backend_dev_host_buffer_type(dev) == buft) {
        return ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    }
    return dev;
}

void replay_note_scratch(std::vector<std::pair<ggml_backend_dev_t, size_t>> & need, const ggml_tensor * t) {
    if (t->view_src != nullptr || buffer_of(t) == nullptr) {
        return;  // views and in-place nodes are not replayed
    }
    ggml_backend_dev_t dev = computing_device(t);
    if (dev == nullptr) {
        return;
    }
    size_t bytes = std::max(ggml_nbytes(t), ggml_backend_buft_get_alloc_size(ggml_backend_dev_buffer_type(dev), t));
    for (auto & d : need) {
        if (d.first == dev) {
            d.second = std::max(d.second, bytes);
            return;
        }
    }
    need.emplace_back(dev, bytes);
}

bool replay_ask(Replayer & r, uint32_t index) { return index < r.cut.size() && r.cut[index]; }

static ReplayDevice * device_for(Replayer & r, ggml_tensor * t) {
    if (on_rpc_device(t)) {
        r.skip(t, std::string("it lies on the RPC device ") + device_name(t) +
                      ", whose clones would each be a network round trip and whose sources the worker cannot reach");
        return nullptr;
    }
    ggml_backend_dev_t dev = computing_device(t);
    for (ReplayDevice & d : r.devices) {
        if (d.dev == dev) {
            return &d;
        }
    }
    r.skip(t, std::string("no scratch buffer on its device ") + (dev ? ggml_backend_dev_name(dev) : "(none)") +
                  " (the captured graph had no node there)");
    return nullptr;
}

// k clones of t in rounds; always lets the scheduler go on (what went wrong is counted).
static void replay_clones(Replayer & r, ReplayDevice & d, ggml_tensor * t) {
    void * base = ggml_backend_buffer_get_base(d.scratch);
    size_t room = ggml_backend_buffer_get_size(d.scratch);
    uint32_t left = r.k;
    while (left > 0) {
        uint32_t n = std::min(left, CLONES_PER_ROUND);
        left -= n;
        ggml_reset(r.ctx);
        ggml_cgraph * graph = ggml_new_graph_custom(r.ctx, CLONES_PER_ROUND + 4, false);
        for (uint32_t c = 0; c < n; c++) {
            ggml_tensor * clone = ggml_new_tensor(r.ctx, t->type, GGML_MAX_DIMS, t->ne);
            clone->op = t->op;
            memcpy(clone->op_params, t->op_params, sizeof(t->op_params));
            for (int s = 0; s < GGML_MAX_SRC; s++) {
                clone->src[s] = t->src[s];
            }
            for (int k = 0; k < GGML_MAX_DIMS; k++) {
                clone->nb[k] = t->nb[k];
            }
#ifdef OPLEDGER_WORKER_HAS_FLAG_COMPUTE
            clone->flags = GGML_TENSOR_FLAG_COMPUTE;
#endif
            if (ggml_backend_buffer_get_alloc_size(d.scratch, clone) > room) {
                r.skip(t, "its output is larger than the scratch buffer");
                return;
            }
            if (ggml_backend_tensor_alloc(d.scratch, clone, base) != GGML_STATUS_SUCCESS) {
                r.skip(t, "ggml could not place a clone in the scratch buffer");
                return;
            }
            ggml_graph_add_node(graph, clone);
        }
        enum ggml_status status = ggml_backend_graph_compute(d.backend, graph);
        if (status != GGML_STATUS_SUCCESS) {
            r.fail(t, "ggml_backend_graph_compute returned " + std::to_string((int) status));
            return;
        }
        r.replayed += n;
    }
}

// k rounds of one trivial clone (a one-element ADD) through the same backend and call as the
// clones' rounds: what a round's launch and synchronisation cost beyond the clones' work.
static void launch_rounds(Replayer & r, ReplayDevice & d, ggml_tensor * t) {
    char * base = (char *) ggml_backend_buffer_get_base(d.scratch);
    size_t align = ggml_backend_buft_get_alignment(ggml_backend_buffer_get_type(d.scratch));
    for (uint32_t round = 0; round < r.k; round++) {
        ggml_reset(r.ctx);
        ggml_cgraph * graph = ggml_new_graph_custom(r.ctx, 4, false);
        ggml_tensor * a = ggml_new_tensor_1d(r.ctx, GGML_TYPE_F32, 1);
        ggml_tensor * sum = ggml_add(r.ctx, a, a);
        if (ggml_backend_tensor_alloc(d.scratch, a, base) != GGML_STATUS_SUCCESS ||
            ggml_backend_tensor_alloc(d.scratch, sum, base + align) != GGML_STATUS_SUCCESS) {
            r.skip(t, "ggml could not place a launch round's tensors in the scratch buffer");
            return;
        }
#ifdef OPLEDGER_WORKER_HAS_FLAG_COMPUTE
        sum->flags |= GGML_TENSOR_FLAG_COMPUTE;
#endif
        ggml_graph_add_node(graph, sum);
        enum ggml_status status = ggml_backend_graph_compute(d.backend, graph);
        if (status != GGML_STATUS_SUCCESS) {
            r.fail(t, "a launch round's ggml_backend_graph_compute returned " + std::to_string((int) status));
            return;
        }
        r.replayed++;
    }
}

bool replay_observe(Replayer & r, uint32_t index, ggml_tensor * t) {
    if (index >= r.replay.size() || !r.replay[index] || r.k == 0) {
        return true;
    }
    ReplayDevice * d = device_for(r, t);
    if (d == nullptr) {
        return true;
    }
    if (r.launches) {
        launch_rounds(r, *d, t);
    } else {
        replay_clones(r, *d, t);
    }
    // never "false": that would end the split early and silently
    return true;
}

// A backend and a scratch buffer of `bytes` on `dev`; a CPU backend computes on the worker's
// pool with its threads.
static ReplayDevice open_device(Worker & w, ggml_backend_dev_t dev, size_t bytes) {
    ReplayDevice d;
    d.dev = dev;
    d.backend = ggml_backend_dev_init(dev, nullptr);
    if (d.backend == nullptr) {
        throw std::runtime_error(std::string("ggml could not start a backend on ") + ggml_backend_dev_name(dev) +
                                 " for replays (" + log_tail(2) + ")");
    }
    if (ggml_backend_is_cpu(d.backend)) {
        ggml_backend_cpu_set_n_threads(d.backend, w.threads);
        ggml_backend_cpu_set_threadpool(d.backend, w.pool);
    }
    d.scratch = ggml_backend_buft_alloc_buffer(ggml_backend_dev_buffer_type(dev), bytes);
    if (d.scratch == nullptr) {
        ggml_backend_free(d.backend);
        throw std::runtime_error("allocating a " + std::to_string(bytes) + "-byte replay scratch buffer on " +
                                 ggml_backend_dev_name(dev) + " failed");
    }
    // touched once, so that replays pay no first-touch page faults
    ggml_backend_buffer_clear(d.scratch, 0);
    return d;
}

// Backends and scratch buffers for every device of the captured graph, kept between requests
// and grown where the graph needs more.
static Replayer & replayer_for(Worker & w, const Observer & o) {
    if (o.scratch_need.empty()) {
        throw std::runtime_error("no captured graph to size the replay's scratch: decode with observe 'capture' first");
    }
    if (!w.replayer) {
        w.replayer = std::make_shared<Replayer>();
        size_t slots = CLONES_PER_ROUND + 4;
        ggml_init_params p = {ggml_tensor_overhead() * slots + ggml_graph_overhead_custom(slots, false), nullptr, true};
        w.replayer->ctx = ggml_init(p);
        if (w.replayer->ctx == nullptr) {
            w.replayer.reset();
            throw std::runtime_error("ggml_init failed for the replay's clones");
        }
    }
    Replayer & r = *w.replayer;
    for (const auto & need : o.scratch_need) {
        ggml_backend_dev_t dev = need.first;
        ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(dev);
        // room for the launch rounds' two one-element tensors too
        size_t bytes = std::max(need.second, 2 * ggml_backend_buft_get_alignment(buft) + 64);
        auto it = std::find_if(r.devices.begin(), r.devices.end(), [&](const ReplayDevice & d) { return d.dev == dev; });
        if (it != r.devices.end() && ggml_backend_buffer_get_size(it->scratch) >= bytes) {
            continue;
        }
        if (it != r.devices.end()) {
            ggml_backend_buffer_free(it->scratch);
            ggml_backend_free(it->backend);
            r.devices.erase(it);
        }
        r.devices.push_back(open_device(w, dev, bytes));
    }
    return r;
}

// Node indices into a mask.
static std::vector<uint8_t> mask_field(const Json & req, const char * key) {
    std::vector<int32_t> idx = ints_field(req, key);
    std::vector<uint8_t> mask;
    for (int32_t i : idx) {
        if (i < 0 || i > 10000000) {
            throw std::runtime_error(std::string("field '") + key + "' holds the node index " + std::to_string(i));
        }
        if ((size_t) i >= mask.size()) {
            mask.resize((size_t) i + 1, 0);
        }
        mask[(size_t) i] = 1;
    }
    return mask;
}

// "replay": a decode of the observed context (the fields of "decode") with the replay plan.
void op_replay(Worker & w, const Json & req, std::string & out) {
    if (str_field(req, "ctx", "") != "observed") {
        throw std::runtime_error("a replay runs on the observed context (field 'ctx' must be \"observed\")");
    }
    Ctx & c = w.pick(req);
    int64_t k = int_field(req, "k");
    if (k < 0 || k > 65536) {
        throw std::runtime_error("field 'k' must be 0 to 65536");
    }
    std::vector<uint8_t> cut = mask_field(req, "cut");
    std::vector<uint8_t> replay = mask_field(req, "replay");
    bool launches = bool_field(req, "launches", false);
    Replayer & r = replayer_for(w, *c.obs);
    r.cut = std::move(cut);
    r.replay = std::move(replay);
    r.k = (uint32_t) k;
    r.launches = launches;
    r.replayed = r.skipped = r.failed = 0;
    r.problem.clear();
    Json decode = req;
    decode.obj["observe"].kind = Json::Str;
    decode.obj["observe"].str = "replay";
    c.obs->replayer = &r;
    try {
        op_decode(w, decode, out, false);
    } catch (...) {
        c.obs->replayer = nullptr;
        throw;
    }
    c.obs->replayer = nullptr;
    out += ",\"replayed\":" + std::to_string(r.replayed);
    out += ",\"skipped\":" + std::to_string(r.skipped);
    out += ",\"failed\":" + std::to_string(r.failed);
    if (!r.problem.empty()) {
        out += ",\"problem\":";
        json_str(out, r.problem);
    }
}
