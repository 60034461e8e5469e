#!/usr/bin/env python3
"""Independent dequantization of GPTQ / AWQ / AutoRound / bitsandbytes checkpoints, written from
../shared/docs/FORMATS.md sections 3-6 with numpy only (no qinfer code, no safetensors package).

  quant_ref.py check QUANT_DIR DENSE_DIR   compare with `qinfer dequant` output: every tensor must be equal
  quant_ref.py dense QUANT_DIR OUT_DIR     write the dequantized checkpoint in fp32 (for transformers goldens)
"""
import json
import os
import struct
import sys

import numpy as np

DTYPES = {"F16": np.float16, "BF16": np.uint16, "F32": np.float32, "I32": np.int32, "U8": np.uint8, "I64": np.int64}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        a = np.frombuffer(data[base + b : base + e], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
        if info["dtype"] == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[name] = a
    return out


def read_checkpoint(d):
    tensors = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            tensors.update(read_safetensors(os.path.join(d, f)))
    return tensors


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, a in tensors.items():
        a = np.ascontiguousarray(a, dtype=np.float32)
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        blobs.append(a.tobytes())
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def quant_config(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    if cfg.get("quantization_config"):
        return cfg["quantization_config"]
    for name in ("quantize_config.json", "quant_config.json"):
        p = os.path.join(d, name)
        if os.path.exists(p):
            return json.load(open(p))
    return None


def unpack_stream(words, bits, count):
    """Columns of `words` (uint32 [R, C]) are LSB-first bit streams along the rows; returns [count, C] fields."""
    w = np.ascontiguousarray(words.astype(np.uint32).T)  # [C, R]
    b = np.unpackbits(w.view(np.uint8).reshape(w.shape[0], -1), axis=1, bitorder="little")  # [C, R*32]
    b = b[:, : count * bits].reshape(w.shape[0], count, bits).astype(np.int64)
    return (b * (1 << np.arange(bits))).sum(axis=2).T  # [count, C]


def unpack_along_cols(words, bits, count):
    """Rows of `words` (uint32 [R, W]) are LSB-first bit streams along the columns; returns [R, count] fields."""
    return unpack_stream(words.T, bits, count).T


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble i holds column 8c + AWQ_ORDER[i]


def awq_unpack(words, n):
    w = words.astype(np.uint32)
    out = np.zeros((w.shape[0], n), dtype=np.int64)
    for i in range(8):
        out[:, np.arange(n // 8) * 8 + AWQ_ORDER[i]] = (w >> (4 * i)) & 0xF
    return out


def dequant_gptq(t, p, qc, v1):
    qweight, qzeros, scales = t[p + ".qweight"], t[p + ".qzeros"], t[p + ".scales"].astype(np.float32)
    bits = qc["bits"]
    K, N = qweight.shape[0] * 32 // bits, qweight.shape[1]
    G = qc["group_size"] if qc["group_size"] > 0 else K
    q = unpack_stream(qweight, bits, K)  # [K, N]
    z = unpack_along_cols(qzeros, bits, N)  # [groups, N]
    if v1:
        z = z + 1
    g_idx = t[p + ".g_idx"].astype(np.int64) if p + ".g_idx" in t else np.arange(K) // G
    w = scales[g_idx, :] * (q - z[g_idx, :]).astype(np.float32)  # [K, N]
    return w.T


def dequant_awq(t, p, qc):
    qweight, qzeros, scales = t[p + ".qweight"], t[p + ".qzeros"], t[p + ".scales"].astype(np.float32)
    K, N = qweight.shape[0], qweight.shape[1] * 8
    G = qc.get("group_size", qc.get("q_group_size", 128))
    G = G if G > 0 else K
    q, z = awq_unpack(qweight, N), awq_unpack(qzeros, N)
    g = np.arange(K) // G
    return ((q - z[g, :]).astype(np.float32) * scales[g, :]).T


def dequant_awq_gemv(t, p, qc):
    """AutoAWQ's GEMV layout: qweight [N, K/8] along K in natural nibble order, qzeros [N, W] along the groups,
    scales [N, 8 W] of which the first K/G columns are used."""
    qweight, qzeros, scales = t[p + ".qweight"], t[p + ".qzeros"], t[p + ".scales"].astype(np.float32)
    N, K = qweight.shape[0], qweight.shape[1] * 8
    G = qc.get("group_size", qc.get("q_group_size", 128))
    G = G if G > 0 else K
    shifts = 4 * np.arange(8, dtype=np.uint32)
    q = ((qweight.astype(np.uint32)[:, :, None] >> shifts) & 0xF).reshape(N, K).astype(np.int64)
    z = ((qzeros.astype(np.uint32)[:, :, None] >> shifts) & 0xF).reshape(N, -1).astype(np.int64)
    g = np.arange(K) // G
    return (q - z[:, g]).astype(np.float32) * scales[:, g]


def dequant_bnb(t, p):
    key = [k for k in t if k.startswith(p + ".weight.quant_state.bitsandbytes__")][0]
    state = json.loads(bytes(t[key]).decode())
    N, K = state["shape"]
    codes = t[p + ".weight"].reshape(-1)
    c = np.empty(codes.size * 2, dtype=np.int64)
    c[0::2], c[1::2] = codes >> 4, codes & 0xF  # element 2j in the high nibble
    c = c[: N * K]
    absmax = t[p + ".weight.absmax"]
    if absmax.dtype == np.uint8:  # double quantization
        nested = t[p + ".weight.nested_quant_map"][absmax] * np.repeat(t[p + ".weight.nested_absmax"], 256)[: absmax.size]
        absmax = (nested + np.float32(state["nested_offset"])).astype(np.float32)
    table = t[p + ".weight.quant_map"]
    return (table[c] * np.repeat(absmax, state["blocksize"])[: N * K]).reshape(N, K)


def dequantize(d):
    """Every tensor of the checkpoint as the dense model holds it: name -> fp32 array."""
    t = read_checkpoint(d)
    qc = quant_config(d) or {}
    method = qc.get("quant_method", "gptq" if "bits" in qc else "")
    packing = qc.get("packing_format", qc.get("backend", "auto_round"))
    out = {}
    modules = {k[: -len(".qweight")] for k in t if k.endswith(".qweight")}
    modules |= {k.split(".weight.quant_state.")[0] for k in t if ".weight.quant_state." in k}
    for p in sorted(modules):
        if method == "awq" and str(qc.get("version", "gemm")).lower() == "gemv":
            out[p + ".weight"] = dequant_awq_gemv(t, p, qc)
        elif method == "awq" or (method == "auto-round" and packing.endswith("awq")):
            out[p + ".weight"] = dequant_awq(t, p, qc)
        elif method == "bitsandbytes":
            out[p + ".weight"] = dequant_bnb(t, p)
        else:
            v1 = qc.get("checkpoint_format", "gptq") == "gptq" if method == "gptq" else packing.endswith("gptq")
            out[p + ".weight"] = dequant_gptq(t, p, qc, v1)
    quant_suffixes = (".qweight", ".qzeros", ".scales", ".g_idx")
    for k, a in t.items():
        if any(k.startswith(p + s) for p in modules for s in quant_suffixes + (".weight",)):
            continue
        out[k] = a.astype(np.float32)
    return out


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("check", "dense"):
        sys.exit(__doc__)
    mode, qdir, other = sys.argv[1:]
    ref = dequantize(qdir)
    if mode == "dense":
        os.makedirs(other, exist_ok=True)
        write_safetensors(os.path.join(other, "model.safetensors"), ref)
        cfg = json.load(open(os.path.join(qdir, "config.json")))
        cfg.pop("quantization_config", None)
        cfg["torch_dtype"] = "float32"
        json.dump(cfg, open(os.path.join(other, "config.json"), "w"), indent=2)
        print(f"wrote {other}: {len(ref)} tensors in fp32")
        return
    got = read_checkpoint(other)
    bad = 0
    if set(got) != set(ref):
        print(f"{qdir}: tensor names differ: only qinfer {sorted(set(got) - set(ref))[:4]}, only reference {sorted(set(ref) - set(got))[:4]}")
        sys.exit(1)
    for k in sorted(ref):
        a, b = ref[k], got[k]
        if a.shape != b.shape or not np.array_equal(a, b):
            diff = np.abs(a - b).max() if a.shape == b.shape else float("nan")
            print(f"{qdir}: {k}: qinfer differs from the reference (shapes {b.shape} vs {a.shape}, max |diff| {diff})")
            bad += 1
    t = read_checkpoint(qdir)
    n_quant = sum(1 for k in t if k.endswith(".qweight") or ".weight.quant_state." in k)
    print(f"{qdir}: {len(ref)} tensors, {n_quant} dequantized, {'all equal' if not bad else str(bad) + ' differ'}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
