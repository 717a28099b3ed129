#!/usr/bin/env python3
"""compare.py [DIST]: Dist's simulated throughput beside published large-scale training runs.

Runs `DIST sim SCRIPT --json --set ...` for every row of ROWS below (DIST defaults to
build/bin/dist under the repository root), converts the simulated step time into the unit
the source published (with the source's own FLOP formula where it gives one) and prints a
markdown table, the median absolute error and the three worst rows.

Standard library only. Options: --jobs N (simulations run at once, default 2), --only TEXT
(rows whose id contains TEXT), --json FILE (also write the rows with their results).
"""

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# ---------------------------------------------------------------------------------------------
# The published rows. Each: id, source (where the number is printed), model label, script in
# this folder, --set overrides, layout, published value and unit (metric), and notes. `shape`
# carries what the unit conversion needs. `flag` marks rows whose configuration is partly
# inferred (see note); they are shown but left out of the error statistics. `calibration` marks
# the rows a profile's efficiencies were set from (stdlib/hardware/a100-80g.toml): counted, and
# counted apart.
# ---------------------------------------------------------------------------------------------

# Full citations, keyed by the short source names used in the rows (printed under the table).
SOURCES = {
    "Narayanan21 T1": "D. Narayanan et al., Efficient Large-Scale Language Model Training on GPU "
                      "Clusters Using Megatron-LM, SC21 (arXiv 2104.04473), Table 1, sec. 5.1; "
                      "MBS and virtual stages from NVIDIA/Megatron-LM examples/sc21/run_table_1.sh",
    "Korthikanti22 T5": "V. Korthikanti et al., Reducing Activation Recomputation in Large "
                        "Transformer Models, MLSys 2023 (arXiv 2205.05198), Table 3 (models), "
                        "Table 5 (iteration times), sec. 6.3 and abstract (530B on 2240 GPUs)",
    "Qi24 T4": "P. Qi, X. Wan, G. Huang, M. Lin, Zero Bubble Pipeline Parallelism, ICLR 2024 "
               "(arXiv 2401.10241v1), sec. 5.1 Table 3 (setup), sec. 5.2 Table 4 (samples per GPU "
               "per second, smallest microbatch count per model)",
    "BLOOM README": "bigscience-workshop/bigscience, train/tr11-176B-ml/README.md, 'Replica setup' "
                    "and the iteration-85376 log line under 'Important checkpoints'",
    "Llama3 T4 p10": "Llama Team, The Llama 3 Herd of Models (arXiv 2407.21783), sec. 3.3.2, "
                     "Table 4, p. 10",
    "titan perf A100": "pytorch/torchtitan docs/performance.md (revision 0413364), 'Llama 3 "
                       "performance numbers' (64 A100 80GB, FSDP2)",
    "titan perf H100": "pytorch/torchtitan docs/performance.md (Dec 2024 revision), Tables 1 and 3 "
                       "(Grand Teton H100, FSDP2, bf16)",
}

NARAYANAN = "Narayanan21 T1"
# Table 1 columns: params (B), heads, hidden, layers, t, p, GPUs, batch, TFLOP/s per GPU,
# % of peak. Microbatch size and virtual stages from NVIDIA/Megatron-LM
# examples/sc21/run_table_1.sh (MBS; --num-layers-per-virtual-pipeline-stage, giving
# v = layers / p / that number).
MEGATRON_T1 = [
    # name, heads, hidden, layers, t, p, gpus, batch, tflops, pct, mbs, v
    ("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137, 44, 16, 1),
    ("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138, 44, 16, 1),
    ("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142, 46, 16, 1),
    ("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135, 43, 8, 1),
    ("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138, 44, 4, 1),
    ("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140, 45, 2, 3),
    ("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148, 47, 2, 2),
    ("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155, 50, 1, 2),
    ("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163, 52, 1, 3),
    ("1008.0B", 160, 25600, 128, 8, 64, 3072, 3072, 163, 52, 1, 1),
]

KORTHIKANTI = "Korthikanti22 T5"
# Table 3: heads, hidden, layers, t, p, GPUs, global batch (micro-batch 1, 4 for the 22B
# model); sequence 2048, vocabulary 51,200, no data parallelism; the 175B and 530B models on
# the interleaved schedule with 3 model chunks per rank. Table 5: seconds per iteration with full
# recomputation and with sequence parallelism + selective recomputation.
KORTHIKANTI_T5 = [
    # name, heads, hidden, layers, t, p, gpus, batch, v, full recompute s, present work s
    ("22B", 64, 6144, 48, 8, 1, 8, 4, 1, 1.42, 1.10),
    ("175B", 96, 12288, 96, 8, 8, 64, 64, 3, 18.13, 13.75),
    ("530B", 128, 20480, 105, 8, 35, 280, 280, 3, 49.05, 37.83),
    ("1T", 160, 25600, 128, 8, 64, 512, 512, 1, 94.42, 71.49),
]

ZB = "Qi24 T4"
# Table 3: layers, heads, hidden, sequence 1024, stages = GPUs, microbatch size. Table 4:
# samples per GPU per second at the smallest microbatch count of each model.
ZB_MODELS = {
    # name: layers, heads, hidden, stages, mbs, microbatches, {schedule: samples/GPU/s}
    "1.5B": (22, 24, 2304, 8, 6, 24, {"1F1B": 11.8, "1F1B-I": 13.1, "ZB-1p": 12.9, "ZB-2p": 14.5}),
    "6.2B": (30, 32, 4096, 8, 3, 24, {"1F1B": 3.50, "1F1B-I": 4.01, "ZB-1p": 3.88, "ZB-2p": 4.32}),
    "14.6B": (46, 40, 5120, 16, 1, 48, {"1F1B": 1.40, "1F1B-I": 1.54, "ZB-1p": 1.61, "ZB-2p": 1.81}),
    "28.3B": (62, 48, 6144, 32, 1, 96, {"1F1B": 0.76, "1F1B-I": 0.82, "ZB-1p": 0.87, "ZB-2p": 0.99}),
}


def zb_partition(blocks, stages):
    """The paper's split: the first and the last stage hold one layer fewer."""
    inner = (blocks + 2) // stages
    assert inner * stages - 2 == blocks, (blocks, stages)
    return [inner - 1] + [inner] * (stages - 2) + [inner - 1]


def listing(xs):
    return "[" + ",".join(str(x) for x in xs) + "]"


def build_rows():
    rows = []
    for name, a, h, l, t, p, n, batch, tflops, pct, mbs, v in MEGATRON_T1:
        d = n // (t * p)
        micro = batch // (d * mbs)
        kind = "interleaved_1f1b" if v > 1 else "1f1b"
        rows.append(dict(
            id=f"megatron-{name}", source=NARAYANAN, model=f"GPT {name}",
            script="megatron_gpt.dist", gpus=n,
            layout=f"t{t} p{p} d{d}, mbs {mbs}, m {micro}" + (f", v{v}" if v > 1 else ""),
            sets=[f"model.layers={l}", f"model.heads={a}", f"model.width={h}",
                  f"mesh.devices=a100 x {n}", f"mesh.dp={d}", f"mesh.tp={t}", f"mesh.pp={p}",
                  f"schedule.kind={kind}", f"schedule.virtual_stages={v}",
                  f"schedule.microbatches={micro}", f"train.batch={batch}"],
            metric="megatron_tflops", unit="TFLOP/s/GPU", published=tflops,
            shape=dict(B=batch, s=2048, l=l, h=h, V=51200),
            note=f"{pct}% of 312 TFLOP/s; full recompute; paper's FLOP formula (96 B s l h^2 ...)"))
    # Korthikanti et al. 2022, Tables 3 and 5: iteration time with full recomputation and with
    # sequence parallelism + selective recomputation ("present work"); no data parallelism.
    for name, a, h, l, t, p, n, batch, v, full_s, present_s in KORTHIKANTI_T5:
        micro = batch  # micro-batch 1, except the 22B model's one micro-batch of 4
        mbs = 1
        if p == 1:
            micro, mbs = 1, batch
        kind = "interleaved_1f1b" if v > 1 else "1f1b"
        for label, sp, rec, secs in (("full recompute", "false", "full", full_s),
                                     ("sp + selective", "true", "selective", present_s)):
            rows.append(dict(
                id=f"korthikanti-{name}-{rec}", source=KORTHIKANTI, calibration=True, model=f"GPT {name}, {label}",
                script="megatron_gpt.dist", gpus=n,
                layout=f"t{t} p{p}, mbs {mbs}, m {micro}" + (f", v{v}" if v > 1 else ""),
                sets=[f"model.layers={l}", f"model.heads={a}", f"model.width={h}",
                      f"mesh.devices=a100 x {n}", "mesh.dp=1", f"mesh.tp={t}", f"mesh.pp={p}",
                      f"mesh.sp={sp}", f"schedule.kind={kind}", f"schedule.virtual_stages={v}",
                      f"schedule.microbatches={micro}", f"schedule.recompute={rec}",
                      f"train.batch={batch}"],
                metric="samples_per_s", unit="samples/s", published=batch / secs,
                shape=dict(B=batch),
                note=f"{secs} s per iteration at batch {batch}"))
    # Section 6.3: the 530B model on 2240 GPUs (8-way data parallelism, the batch scaled with
    # it), MFU 54.2% (present work) and 42.1% (full recomputation, the abstract).
    for label, sp, rec, mfu in (("sp + selective", "true", "selective", 54.2),
                                ("full recompute", "false", "full", 42.1)):
        rows.append(dict(
            id=f"korthikanti-530B-dp8-{rec}", source=KORTHIKANTI, calibration=True,
            model=f"GPT 530B, {label}", script="megatron_gpt.dist", gpus=2240,
            layout="t8 p35 d8, mbs 1, m 280, v3",
            sets=["model.layers=105", "model.heads=128", "model.width=20480",
                  "mesh.devices=a100 x 2240", "mesh.dp=8", "mesh.tp=8", "mesh.pp=35",
                  f"mesh.sp={sp}", "schedule.kind=interleaved_1f1b", "schedule.virtual_stages=3",
                  "schedule.microbatches=280", f"schedule.recompute={rec}", "train.batch=2240"],
            metric="megatron_mfu", unit="MFU %", published=mfu,
            shape=dict(B=2240, s=2048, l=105, h=20480, V=51200),
            note="MFU with 72 B s l h^2 (1 + s/6h + V/12lh) (Korthikanti eq. 7) over 312 TFLOP/s; "
                 "batch 2240 (280 per replica, weak scaling from Table 3's row)"))
    for name, (l, a, h, p, mbs, m, pubs) in ZB_MODELS.items():
        for sched, value in pubs.items():
            sets = [f"model.layers={l}", f"model.heads={a}", f"model.width={h}",
                    f"mesh.devices=a100 x {p}", f"mesh.pp={p}", f"schedule.microbatches={m}",
                    f"train.batch={m * mbs}"]
            layout = f"p{p}, mbs {mbs}, m {m}"
            if sched == "1F1B-I":
                v = l // p
                if v < 2:
                    continue  # not expressible: fewer layers than 2 per rank (noted below)
                # "each transformer layer serves as a chunk" is not expressible: Dist's own
                # balanced partition of p * v stages instead.
                sets += ["schedule.kind=interleaved_1f1b", f"schedule.virtual_stages={v}"]
                layout += f", v{v}"
            else:
                kind = {"1F1B": "1f1b", "ZB-1p": "zb_h1", "ZB-2p": "zb_h2"}[sched]
                sets += [f"schedule.kind={kind}",
                         f"schedule.partition={listing(zb_partition(l, p))}"]
            rows.append(dict(
                id=f"zb-{name}-{sched}", source=ZB, model=f"GPT {name}, {sched}",
                script="zero_bubble_gpt.dist", gpus=p, layout=layout, sets=sets,
                metric="samples_per_gpu_s", unit="samples/s/GPU", published=value,
                shape=dict(B=m * mbs),
                note="ZB-1p/ZB-2p simulated as Dist's zb_h1/zb_h2" if sched.startswith("ZB") else ""))
    rows.append(dict(
        id="bloom-176B", source="BLOOM README",
        model="BLOOM 176B", script="bloom_176b.dist", gpus=384,
        layout="t4 p12 d8, ZeRO-1, mbs 2, m 128", sets=["mesh.devices=a100_jz x 384"],
        metric="samples_per_s", unit="samples/s", published=19.561, shape=dict(B=2048),
        note="104.70 s/iteration at GBS 2048; logged 149.77 TFLOPs (hardware, with recompute); "
             "README's estimate uses ~150 TFLOP/s per GPU"))
    llama = "Llama3 T4 p10"
    for n, cp, dp, seq, bdp, tflops, mfu in ((8192, 1, 64, 8192, 32, 430, 43),
                                             (16384, 1, 128, 8192, 16, 400, 41),
                                             (16384, 16, 8, 131072, 16, 380, 38)):
        rows.append(dict(
            id=f"llama3-405B-{n}-cp{cp}", source=llama, model="Llama 3 405B",
            script="llama3_405b.dist", gpus=n,
            layout=f"t8 cp{cp} p16 d{dp}, seq {seq}, v2, m {bdp}",
            sets=[f"mesh.devices=h100 x {n}", f"mesh.dp={dp}", f"mesh.cp={cp}",
                  f"model.context={seq}", f"schedule.microbatches={bdp}",
                  f"train.batch={bdp * dp}"],
            metric="palm_tflops", unit="TFLOP/s/GPU", published=tflops,
            shape=dict(B=bdp * dp, s=seq, l=126, d=16384, f=53248, heads=128, kv=8, hd=128,
                       V=128256),
            note=f"BF16 MFU {mfu}%; FLOPs per token 6N + 12 L H Q T (PaLM, which the paper cites "
                 "for MFU), N without the input embedding; v, mbs assumed"
                 + ("; the arXiv v1 text prints DP 4 for this row, v3 prints 8" if cp > 1 else "")))
    titan_a100, titan_h100 = "titan perf A100", "titan perf H100"
    for rid, src, model, n, lbs, rec, dev, value, note, sets in (
            ("titan-8B-64xA100", titan_a100, "Llama 3 8B", 64, 1, "selective", "a100", 2973,
             "MFU 58.2%; 'selective op' AC; seq 8192 (train_configs/llama3_8b.toml)", []),
            ("titan-70B-64xA100", titan_a100, "Llama 3 70B", 64, 1, "full", "a100", 331,
             "MFU 51.7%; full AC; seq 8192 (train_configs/llama3_70b.toml)",
             ["model.layers=80", "model.heads=64", "model.width=8192", "model.hidden=28672"]),
            ("titan-8B-8xH100", titan_h100, "Llama 3.1 8B", 8, 2, "selective",
             "h100_gt500", 5762, "FSDP eager (6,667 with torch.compile); 82.4 GiB measured; H100 96 GB HBM2e at 500 W", []),
            ("titan-8B-128xH100", titan_h100, "Llama 3.1 8B", 128, 2, "selective",
             "h100_gt500", 5605, "FSDP eager (6,514 with torch.compile); 67.0 GiB measured; H100 96 GB HBM2e at 500 W", [])):
        rows.append(dict(
            id=rid, source=src, model=model, script="torchtitan_llama3.dist", gpus=n,
            layout=f"FSDP {n} (ZeRO-3), local batch {lbs}, {rec} AC",
            sets=sets + [f"mesh.devices={dev} x {n}", f"mesh.dp={n}", f"train.batch={n * lbs}",
                         f"schedule.recompute={rec}"],
            metric="tokens_per_gpu_s", unit="tokens/s/GPU", published=value,
            shape=dict(B=n * lbs, s=8192), note=note))
    return rows


# ---------------------------------------------------------------------------------------------
# Unit conversions: from the simulated step time t (seconds) and the GPU count n.
# ---------------------------------------------------------------------------------------------

def megatron_flops(B, s, l, h, V, recompute=True):
    """Narayanan et al. 2021, eq. (3): 96 B s l h^2 (1 + s/6h + V/16lh) with activation
    recomputation. Without it (Korthikanti et al.'s model FLOPs) the same count has three
    passes over the layers instead of four: 72 B s l h^2 (1 + s/6h + V/12lh)."""
    if recompute:
        return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


def palm_flops_per_token(s, l, d, f, heads, kv, hd, V):
    """6 N + 12 L H Q T (Chowdhery et al. 2022, appendix B); N: every parameter but the input
    embedding table (a lookup), the output head included."""
    per_layer = 2 * d * heads * hd + 2 * d * kv * hd + 3 * d * f + 2 * d
    n = l * per_layer + d + d * V
    return 6 * n + 12 * l * heads * hd * s


def convert(row, t):
    n, sh, m = row["gpus"], row["shape"], row["metric"]
    if m == "megatron_tflops":
        return megatron_flops(**sh) / t / n / 1e12
    if m == "megatron_mfu":
        return 100 * megatron_flops(**sh, recompute=False) / t / n / 312e12
    if m == "samples_per_gpu_s":
        return sh["B"] / t / n
    if m == "samples_per_s":
        return sh["B"] / t
    if m == "palm_tflops":
        per_tok = palm_flops_per_token(sh["s"], sh["l"], sh["d"], sh["f"], sh["heads"], sh["kv"],
                                       sh["hd"], sh["V"])
        return sh["B"] * sh["s"] * per_tok / t / n / 1e12
    if m == "tokens_per_gpu_s":
        return sh["B"] * sh["s"] / t / n
    raise ValueError(m)


# ---------------------------------------------------------------------------------------------

def simulate(dist, row):
    cmd = [dist, "sim", os.path.join(HERE, row["script"]), "--json"]
    for s in row["sets"]:
        cmd += ["--set", s]
    for attempt in range(6):  # the binary may be rebuilt under us: wait and retry
        if os.path.exists(dist):
            break
        time.sleep(60)
    env = dict(os.environ)  # bench/published/hardware holds the profiles of the rows' own parts
    env["DIST_PATH"] = HERE + (os.pathsep + env["DIST_PATH"] if env.get("DIST_PATH") else "")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        return dict(error=(p.stderr.strip() or p.stdout.strip()).splitlines()[:3])
    d = json.loads(p.stdout)
    peak = max(r["peak_memory_bytes"] for r in d["ranks"])
    return dict(step_time_s=d["step_time_s"], bubble=d["bubble_fraction"], fits=d["fits"],
                peak_gb=peak / 1e9, sim_mfu=d["mfu"])


def fmt(x):
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dist", nargs="?", default=os.path.join(ROOT, "build", "bin", "dist"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default="")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    dist = os.path.abspath(args.dist)
    rows = [r for r in build_rows() if args.only in r["id"]]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as ex:
        results = list(ex.map(lambda r: simulate(dist, r), rows))
    print("| source | model | GPUs | layout | published | predicted | pred/pub | error | "
          "sim bubble | sim peak GB (fits) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    scored = []
    for row, res in zip(rows, results):
        row.update(res)
        mark = " †" if row.get("flag") else " ‡" if row.get("calibration") else ""
        if "error" in res:
            print(f"| {row['source']} | {row['model']}{mark} | {row['gpus']} | {row['layout']} | "
                  f"{fmt(row['published'])} {row['unit']} | sim failed: {' '.join(res['error'])} "
                  f"| | | | |")
            continue
        pred = convert(row, res["step_time_s"])
        ratio = pred / row["published"]
        row.update(predicted=pred, ratio=ratio)
        if not row.get("flag"):
            scored.append(row)
        fits = "yes" if res["fits"] else "no"
        print(f"| {row['source']} | {row['model']}{mark} | {row['gpus']:,} | {row['layout']} | "
              f"{fmt(row['published'])} {row['unit']} | {fmt(pred)} | {ratio:.2f} | "
              f"{100 * (ratio - 1):+.0f}% | {res['bubble']:.3f} | {res['peak_gb']:.0f} ({fits}) |")
    print()
    for key, text in SOURCES.items():
        if any(r["source"] == key for r in rows):
            print(f"- {key}: {text}")
    if any(r.get("flag") for r in rows):
        print("\n† configuration partly inferred (see the row's note in compare.py); not in the "
              "statistics below.")
    if any(r.get("calibration") for r in rows):
        print("\n‡ a row the A100 profile's matmul efficiencies were set from.")
    if scored:
        errs = [abs(r["ratio"] - 1) for r in scored]
        print(f"\nMedian absolute error over {len(scored)} rows: {100 * statistics.median(errs):.1f}%"
              f" (median pred/pub {statistics.median(r['ratio'] for r in scored):.2f})")
        held = [abs(r["ratio"] - 1) for r in scored if not r.get("calibration")]
        if held and len(held) < len(scored):
            print(f"Median absolute error over the {len(held)} rows that set no efficiency: "
                  f"{100 * statistics.median(held):.1f}%")
        groups = {}
        for r in scored:
            groups.setdefault(r["id"].split("-")[0], []).append(r["ratio"])
        print("Median pred/pub per source: " + ", ".join(
            f"{k} {statistics.median(v):.2f} ({len(v)})" for k, v in groups.items()))
        print("\nWorst three rows:")
        for r in sorted(scored, key=lambda r: -abs(r["ratio"] - 1))[:3]:
            print(f"- {r['model']} on {r['gpus']:,} GPUs ({r['source']}, {r['layout']}): published "
                  f"{fmt(r['published'])} {r['unit']}, predicted {fmt(r['predicted'])} "
                  f"({100 * (r['ratio'] - 1):+.0f}%)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
