// Standalone op timing: one node of a captured graph rebuilt as a one-op graph on the backend of
// the node's own device (a CPU backend on the worker's thread pool for a CPU node), its sources
// re-created with the node's shapes, strides and types (weights in the CPU backend's repacking
// buffer type where the model's are), filled with valid data, copies rotated, and every
// repetition timed. The worker reports each repetition's time; opledger summarises them.
//
// And the expert ids a TIMED decode routes (`capture_ids`): read from each MUL_MAT_ID node's ids
// source through ggml_backend_tensor_get, row by row (the ids may be a strided view).

#include "optime.h"

// The expert ids of MUL_MAT_ID node `index` (src[2], I32 [n_used, n_tokens]), appended to `out`
// as {"node":index,"ids":[...]}. Ids of another type or layout are skipped.
void capture_expert_ids(const ggml_tensor * t, uint32_t index, std::string & out) {
    const ggml_tensor * ids = t->src[2];
    if (ids == nullptr || ids->type != GGML_TYPE_I32 || buffer_of(ids) == nullptr || ids->ne[2] != 1 ||
        ids->ne[3] != 1 || ids->nb[0] != 4) {
        return;
    }
    size_t n_used = (size_t) std::max<int64_t>(ids->ne[0], 0);
    size_t n_tokens = (size_t) std::max<int64_t>(ids->ne[1], 0);
    std::vector<int32_t> row(n_used);
    if (!out.empty()) {
        out += ",";
    }
    out += "{\"node\":" + std::to_string(index) + ",\"ids\":[";
    for (size_t r = 0; r < n_tokens; r++) {
        if (n_used > 0) {
            ggml_backend_tensor_get(ids, row.data(), r * ids->nb[1], n_used * sizeof(int32_t));
        }
        for (size_t k = 0; k < n_used; k++) {
            out += (r == 0 && k == 0) ? "" : ",";
            out += std::to_string(row[k]);
        }
    }
    out += "]}";
}

namespace {

// What a rebuilt graph owns, freed in reverse order of creation whatever happens.
struct Owned {
    std::vector<ggml_context *> ctxs;
    std::vector<ggml_backend_buffer_t> bufs;
    ggml_backend_t backend = nullptr;

    ~Owned() {
        for (auto it = bufs.rbegin(); it != bufs.rend(); ++it) {
            ggml_backend_buffer_free(*it);
        }
        for (auto it = ctxs.rbegin(); it != ctxs.rend(); ++it) {
            ggml_free(*it);
        }
        if (backend) {
            ggml_backend_free(backend);
        }
    }

    ggml_context * ctx(size_t tensors) {
        ggml_init_params p = {ggml_tensor_overhead() * (tensors + 8) + ggml_graph_overhead(), nullptr, true};
        ggml_context * c = ggml_init(p);
        if (c == nullptr) {
            throw std::runtime_error("ggml could not create a context");
        }
        ctxs.push_back(c);
        return c;
    }

    void alloc(ggml_context * c, ggml_backend_buffer_type_t buft, const char * what) {
        ggml_backend_buffer_t b = ggml_backend_alloc_ctx_tensors_from_buft(c, buft);
        if (b == nullptr) {
            throw std::runtime_error(std::string("allocating the ") + what + " in " + ggml_backend_buft_name(buft) +
                                     " failed (" + log_tail(2) + ")");
        }
        bufs.push_back(b);
    }
};

// One tensor of the node as the request describes it.
struct Desc {
    int64_t ne[4] = {1, 1, 1, 1};
    uint64_t nb[4] = {0, 0, 0, 0};
    ggml_type type = GGML_TYPE_F32;
    bool weight = false;
};

ggml_type type_named(const std::string & name) {
    for (int k = 0; k < GGML_TYPE_COUNT; k++) {
        ggml_type t = (ggml_type) k;
        const char * n = ggml_blck_size(t) > 0 ? ggml_type_name(t) : nullptr;
        if (n != nullptr && name == n) {
            return t;
        }
    }
    throw std::runtime_error("unknown tensor type '" + name + "'");
}

Desc desc_of(const Json & t, const std::string & what) {
    Desc d;
    const Json & ne = field(t, "ne", Json::Arr);
    if (ne.arr.size() != 4) {
        throw std::runtime_error(what + ": 'ne' needs 4 values");
    }
    for (int k = 0; k < 4; k++) {
        if (ne.arr[k].kind != Json::Num || ne.arr[k].num < 0 || ne.arr[k].num != std::floor(ne.arr[k].num)) {
            throw std::runtime_error(what + ": 'ne' holds a value that is no size");
        }
        d.ne[k] = (int64_t) ne.arr[k].num;
    }
    const Json * nb = t.get("nb");
    if (nb != nullptr && nb->kind != Json::Null) {
        if (nb->kind != Json::Arr || nb->arr.size() != 4) {
            throw std::runtime_error(what + ": 'nb' needs 4 values");
        }
        for (int k = 0; k < 4; k++) {
            if (nb->arr[k].kind != Json::Num || nb->arr[k].num < 0) {
                throw std::runtime_error(what + ": 'nb' holds a value that is no stride");
            }
            d.nb[k] = (uint64_t) nb->arr[k].num;
        }
    }
    d.type = type_named(field(t, "type", Json::Str).str);
    d.weight = bool_field(t, "weight", false);
    return d;
}

// Whether the strides are those of a packed tensor (all zero: not given, packed).
bool packed(const Desc & d) {
    if (d.nb[0] == 0 && d.nb[1] == 0 && d.nb[2] == 0 && d.nb[3] == 0) {
        return true;
    }
    uint64_t e0 = ggml_type_size(d.type);
    uint64_t e1 = ggml_row_size(d.type, d.ne[0]);
    uint64_t e2 = e1 * (uint64_t) d.ne[1];
    uint64_t e3 = e2 * (uint64_t) d.ne[2];
    return d.nb[0] == e0 && d.nb[1] == e1 && d.nb[2] == e2 && d.nb[3] == e3;
}

// A deterministic stream of floats in [-1, 1) (SplitMix64).
struct Floats {
    uint64_t state;
    explicit Floats(uint64_t seed) : state(seed) {}
    float next() {
        uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        z ^= z >> 31;
        return (float) ((double) (z >> 40) / (double) (1ULL << 23) - 1.0);
    }
};

// Valid data for a float or quantised tensor of `n_rows` rows of `n_per_row` elements: random
// floats (fixed seed), converted or quantised (ggml_quantize_chunk, a few rows at a time).
std::vector<uint8_t> float_data(ggml_type type, int64_t n_rows, int64_t n_per_row, uint64_t seed) {
    size_t row_bytes = ggml_row_size(type, n_per_row);
    std::vector<uint8_t> out(row_bytes * (size_t) n_rows);
    Floats rng(seed);
    int64_t rows_per_chunk = std::max<int64_t>(1, (1 << 20) / std::max<int64_t>(n_per_row, 1));
    std::vector<float> f;
    std::vector<float> imatrix;
    if (ggml_quantize_requires_imatrix(type)) {
        imatrix.assign((size_t) n_per_row, 1.0f);
    }
    for (int64_t r0 = 0; r0 < n_rows; r0 += rows_per_chunk) {
        int64_t rows = std::min(rows_per_chunk, n_rows - r0);
        size_t n = (size_t) (rows * n_per_row);
        f.resize(n);
        for (float & v : f) {
            v = rng.next();
        }
        uint8_t * dst = out.data() + (size_t) r0 * row_bytes;
        if (type == GGML_TYPE_F32) {
            memcpy(dst, f.data(), n * sizeof(float));
        } else if (type == GGML_TYPE_F16) {
            ggml_fp32_to_fp16_row(f.data(), (ggml_fp16_t *) dst, (int64_t) n);
        } else if (type == GGML_TYPE_BF16) {
            ggml_fp32_to_bf16_row(f.data(), (ggml_bf16_t *) dst, (int64_t) n);
        } else if (ggml_is_quantized(type)) {
            ggml_quantize_chunk(type, f.data(), dst, 0, rows, n_per_row, imatrix.empty() ? nullptr : imatrix.data());
        } else {
            memset(dst, 0, (size_t) rows * row_bytes);
        }
    }
    return out;
}

// The integer values of an index source, repeated over its memory.
std::vector<uint8_t> int_data(ggml_type type, size_t bytes, const std::vector<int64_t> & values) {
    size_t width = type == GGML_TYPE_I64 ? 8 : 4;
    std::vector<uint8_t> out(bytes, 0);
    if (values.empty()) {
        return out;
    }
    for (size_t k = 0; k * width + width <= bytes; k++) {
        int64_t v = values[k % values.size()];
        if (width == 8) {
            memcpy(out.data() + k * 8, &v, 8);
        } else {
            int32_t v32 = (int32_t) v;
            memcpy(out.data() + k * 4, &v32, 4);
        }
    }
    return out;
}

// The repacking ("extra") buffer type of the CPU backend, found through its registry's proc
// address as llama.cpp's loader finds it; null where there is none.
ggml_backend_buffer_type_t cpu_extra_buft(ggml_backend_dev_t cpu) {
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(cpu);
    auto get = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    if (get == nullptr) {
        return nullptr;
    }
    ggml_backend_buffer_type_t * list = get(cpu);
    return list == nullptr ? nullptr : list[0];
}

// Writes one byte in every 64-byte line of `buf` (volatile: the writes are kept), evicting what
// the caches held before.
void flush(std::vector<uint8_t> & buf) {
    volatile uint8_t * p = buf.data();
    for (size_t k = 0; k < buf.size(); k += 64) {
        p[k] = (uint8_t) (p[k] + 1);
    }
}

}  // namespace

void op_time_op(Worker & w, const Json & req, std::string & out) {
    if (!w.model || !w.pool) {
        throw std::runtime_error("no model: send 'load' first");
    }
    const Json & node = field(req, "node", Json::Obj);
    std::string op = field(node, "op", Json::Str).str;
    int64_t reps = int_field(req, "reps");
    int64_t rotate_bytes = int_field(req, "rotate_bytes");
    int64_t flush_bytes = int_field(req, "flush_bytes");
    if (reps < 1 || reps > 100000) {
        throw std::runtime_error("field 'reps' must be 1 to 100000");
    }
    if (rotate_bytes < 0 || flush_bytes < 0 || flush_bytes > (int64_t) 1 << 40) {
        throw std::runtime_error("fields 'rotate_bytes' and 'flush_bytes' must be 0 to 2^40");
    }
    bool repack = bool_field(req, "repack", true);

    // the op: its code checked against its name (a llama.cpp that numbers its ops otherwise is
    // refused), or found by name where the request gives none
    int code = -1;
    const Json * jc = node.get("code");
    if (jc != nullptr && jc->kind != Json::Null) {
        code = (int) int_field(node, "code");
    } else {
        for (int k = 0; k < GGML_OP_COUNT; k++) {
            if (op == ggml_op_name((ggml_op) k)) {
                code = k;
            }
        }
    }
    if (code <= 0 || code >= GGML_OP_COUNT) {
        throw std::runtime_error("op '" + op + "' is no op this llama.cpp computes");
    }
    std::vector<int32_t> params;
    if (node.get("params") != nullptr) {
        params = ints_field(node, "params");
    }
    if (params.size() * sizeof(int32_t) > GGML_MAX_OP_PARAMS) {
        throw std::runtime_error("field 'params' holds more than ggml's op parameters");
    }
    Desc out_d = desc_of(field(node, "out", Json::Obj), "out");
    const Json & jsrcs = field(node, "srcs", Json::Arr);
    if (jsrcs.arr.size() > GGML_MAX_SRC) {
        throw std::runtime_error("more sources than ggml's GGML_MAX_SRC");
    }
    std::vector<bool> present;
    std::vector<Desc> srcs;
    for (size_t k = 0; k < jsrcs.arr.size(); k++) {
        present.push_back(jsrcs.arr[k].kind != Json::Null);
        srcs.push_back(present.back() ? desc_of(jsrcs.arr[k], "source " + std::to_string(k)) : Desc());
    }
    // integer sources' values, per slot
    std::vector<std::vector<int64_t>> ints(srcs.size());
    const Json * jints = req.get("ints");
    if (jints != nullptr && jints->kind != Json::Null) {
        if (jints->kind != Json::Arr || jints->arr.size() > srcs.size()) {
            throw std::runtime_error("field 'ints' is not a list per source");
        }
        for (size_t k = 0; k < jints->arr.size(); k++) {
            const Json & v = jints->arr[k];
            if (v.kind == Json::Null) {
                continue;
            }
            if (v.kind != Json::Arr) {
                throw std::runtime_error("field 'ints' holds a non-list");
            }
            for (const Json & x : v.arr) {
                if (x.kind != Json::Num || x.num != std::floor(x.num)) {
                    throw std::runtime_error("field 'ints' holds a non-integer");
                }
                ints[k].push_back((int64_t) x.num);
            }
        }
    }

    // the node's device: its own backend (the CPU's on the worker's thread pool)
    Owned own;
    std::string dev_name = str_field(node, "device", "CPU");
    ggml_backend_dev_t dev = ggml_backend_dev_by_name(dev_name.c_str());
    if (dev == nullptr) {
        throw std::runtime_error("no device '" + dev_name + "' in this worker's ggml");
    }
    bool cpu = ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU;
    if (cpu) {
        own.backend = ggml_backend_cpu_init();
        if (own.backend) {
            ggml_backend_cpu_set_n_threads(own.backend, w.threads);
            ggml_backend_cpu_set_threadpool(own.backend, w.pool);
        }
    } else {
        own.backend = ggml_backend_dev_init(dev, nullptr);
    }
    if (own.backend == nullptr) {
        throw std::runtime_error("ggml could not start a backend on " + dev_name + " (" + log_tail(2) + ")");
    }
    ggml_backend_buffer_type_t buft = ggml_backend_get_default_buffer_type(own.backend);
    ggml_backend_buffer_type_t extra = cpu && repack ? cpu_extra_buft(dev) : nullptr;

    // copies of the inputs rotated over, up to rotate_bytes in all (1 to 8)
    uint64_t input_bytes = 0;
    std::vector<uint64_t> extent(srcs.size(), 0);
    for (size_t k = 0; k < srcs.size(); k++) {
        if (!present[k]) {
            continue;
        }
        const Desc & s = srcs[k];
        if (packed(s)) {
            extent[k] = ggml_row_size(s.type, s.ne[0]) * (uint64_t) (s.ne[1] * s.ne[2] * s.ne[3]);
        } else {
            uint64_t e = ggml_type_size(s.type);
            for (int d = 0; d < 4; d++) {
                e += (uint64_t) (std::max<int64_t>(s.ne[d], 1) - 1) * s.nb[d];
            }
            extent[k] = e;
        }
        input_bytes += extent[k];
    }
    uint64_t rotation = std::min<uint64_t>(std::max<uint64_t>((uint64_t) rotate_bytes / std::max<uint64_t>(input_bytes, 1), 1), 8);

    std::string weight_buffer = ggml_backend_buft_name(buft);
    std::vector<ggml_cgraph *> graphs;
    std::vector<std::vector<uint8_t>> data(srcs.size());  // each source's bytes, shared by the copies
    for (uint64_t copy = 0; copy < rotation; copy++) {
        ggml_context * wctx = own.ctx(srcs.size());
        ggml_context * actx = own.ctx(2 * srcs.size() + 2);
        std::vector<ggml_tensor *> src_t(srcs.size(), nullptr), base(srcs.size(), nullptr);
        bool has_weights = false;
        for (size_t k = 0; k < srcs.size(); k++) {
            if (!present[k]) {
                continue;
            }
            const Desc & s = srcs[k];
            ggml_context * c = s.weight ? wctx : actx;
            has_weights = has_weights || s.weight;
            if (packed(s)) {
                base[k] = src_t[k] = ggml_new_tensor(c, s.type, 4, s.ne);
            } else {
                // a strided view: a flat base covering its furthest element, then the view
                int64_t blck = ggml_blck_size(s.type);
                int64_t tsize = (int64_t) ggml_type_size(s.type);
                int64_t elems = ((int64_t) extent[k] + tsize - 1) / tsize * blck;
                base[k] = ggml_new_tensor_1d(c, s.type, elems);
                src_t[k] = ggml_view_4d(c, base[k], s.ne[0], s.ne[1], s.ne[2], s.ne[3], s.nb[1], s.nb[2], s.nb[3], 0);
            }
        }
        ggml_tensor * t = ggml_new_tensor(actx, out_d.type, 4, out_d.ne);
        t->op = (ggml_op) code;
        memset(t->op_params, 0, sizeof t->op_params);
        if (!params.empty()) {
            memcpy(t->op_params, params.data(), params.size() * sizeof(int32_t));
        }
        for (size_t k = 0; k < srcs.size(); k++) {
            t->src[k] = src_t[k];
        }
#ifdef OPLEDGER_WORKER_HAS_FLAG_COMPUTE
        t->flags |= GGML_TENSOR_FLAG_COMPUTE;
#endif
        if (op != ggml_op_desc(t)) {
            throw std::runtime_error("op code " + std::to_string(code) + " is '" + ggml_op_desc(t) +
                                     "' in this llama.cpp, not '" + op + "'");
        }
        if (has_weights) {
            // as llama.cpp's loader: weights in the repacking buffer where the device computes
            // the op with them there (asked through a zero-size buffer of that type)
            ggml_backend_buffer_type_t wbuft = buft;
            if (extra != nullptr) {
                ggml_backend_buffer_t probe = ggml_backend_buft_alloc_buffer(extra, 0);
                if (probe != nullptr) {
                    for (size_t k = 0; k < srcs.size(); k++) {
                        if (present[k] && srcs[k].weight) {
                            base[k]->buffer = probe;
                        }
                    }
                    bool supported = ggml_backend_dev_supports_op(dev, t);
                    for (size_t k = 0; k < srcs.size(); k++) {
                        if (present[k] && srcs[k].weight) {
                            base[k]->buffer = nullptr;
                        }
                    }
                    ggml_backend_buffer_free(probe);
                    if (supported) {
                        wbuft = extra;
                    }
                }
            }
            own.alloc(wctx, wbuft, "weights");
            weight_buffer = ggml_backend_buft_name(wbuft);
        }
        own.alloc(actx, buft, "inputs and output");
        if (copy == 0 && !ggml_backend_supports_op(own.backend, t)) {
            throw std::runtime_error(dev_name + " does not compute " + op + " with these sources");
        }
        for (size_t k = 0; k < srcs.size(); k++) {
            if (!present[k]) {
                continue;
            }
            size_t bytes = ggml_nbytes(base[k]);
            if (data[k].size() != bytes) {
                ggml_type ty = base[k]->type;
                if (ty == GGML_TYPE_I32 || ty == GGML_TYPE_I64) {
                    data[k] = int_data(ty, bytes, ints[k]);
                } else {
                    int64_t n_per_row = base[k]->ne[0];
                    data[k] = float_data(ty, ggml_nelements(base[k]) / std::max<int64_t>(n_per_row, 1), n_per_row,
                                         0x5EED0000ULL + k);
                }
            }
            ggml_backend_tensor_set(base[k], data[k].data(), 0, bytes);
        }
        ggml_cgraph * g = ggml_new_graph(actx);
        ggml_build_forward_expand(g, t);
        graphs.push_back(g);
    }
    data.clear();

    // a one-element op computed on the pool after each flush, untimed: the flush takes long
    // enough for the pool's threads to sleep, and waking them is no part of the op
    std::vector<uint8_t> flush_buf((size_t) flush_bytes);
    ggml_cgraph * wake = nullptr;
    if (!flush_buf.empty() && cpu) {
        ggml_context * c = own.ctx(2);
        ggml_tensor * a = ggml_new_tensor_1d(c, GGML_TYPE_F32, 1);
        ggml_tensor * s = ggml_add(c, a, a);
        own.alloc(c, buft, "wake-up node");
        float zero = 0.0f;
        ggml_backend_tensor_set(a, &zero, 0, sizeof zero);
        wake = ggml_new_graph(c);
        ggml_build_forward_expand(wake, s);
    }
    auto compute = [&](ggml_cgraph * g) -> uint64_t {
        if (!flush_buf.empty()) {
            flush(flush_buf);
        }
        if (wake != nullptr) {
            ggml_backend_graph_compute(own.backend, wake);
            ggml_backend_synchronize(own.backend);
        }
        uint64_t t0 = now_ns();
        ggml_status status = ggml_backend_graph_compute(own.backend, g);
        ggml_backend_synchronize(own.backend);
        uint64_t ns = now_ns() - t0;
        if (status != GGML_STATUS_SUCCESS) {
            throw std::runtime_error("computing " + op + " alone on " + dev_name + " failed (status " +
                                     std::to_string((int) status) + ")");
        }
        return ns;
    };
    std::vector<uint64_t> ns;
    try {
        for (ggml_cgraph * g : graphs) {
            compute(g);  // warm-up: each copy once
        }
        for (int64_t r = 0; r < reps; r++) {
            ns.push_back(compute(graphs[(size_t) r % graphs.size()]));
        }
    } catch (...) {
        w.pause();
        throw;
    }
    w.pause();
    out += ",\"ns\":[";
    for (size_t k = 0; k < ns.size(); k++) {
        out += k ? "," : "";
        json_u64(out, ns[k]);
    }
    out += "],\"rotation\":" + std::to_string(rotation);
    out += ",\"weight_buffer\":";
    json_str(out, weight_buffer);
    out += ",\"backend\":";
    json_str(out, ggml_backend_name(own.backend));
}
