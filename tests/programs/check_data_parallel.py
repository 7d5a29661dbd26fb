#!/usr/bin/env python3
"""The programs' --data-parallel under mpirun, as a user runs the classic batch job. infer-generate: the prompts
split across the ranks (one engine each), the results printed once, by rank 0, in prompt order, equal to one
process's; one summary for the job; a rank with no prompts; an error on the ranks ends the job with the
message. infer-offline-batch: one summary line for all the requests, and the first answers.

usage: check_data_parallel.py BIN_DIR MODEL MPIEXEC"""
import json
import os
import subprocess
import sys
import tempfile

from harness import check, finish

bin_dir, model, mpiexec = sys.argv[1:4]
exe = os.path.join(bin_dir, "infer-generate")
# Open MPI as root (CI's containers), oversubscribed on a 2-core machine, without the single-copy transport
# that needs ptrace rights.
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_rmaps_base_oversubscribe="1")
common = ["--model", model, "--backend", "cpu", "--temperature", "0", "--ignore-eos", "--max-tokens", "8", "--json"]


def run(ranks, *args):
    cmd = [exe, *common, *args] if ranks == 0 else [mpiexec, "-n", str(ranks), exe, "--data-parallel", *common, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


with tempfile.TemporaryDirectory() as tmp:
    prompts = os.path.join(tmp, "prompts.txt")
    with open(prompts, "w", encoding="utf-8") as f:
        f.write("The capital of France is\nWrite a haiku about the sea\nOne two three\n2+2=\nOnce upon a time\n")
    one = run(0, "--prompts", prompts)
    check(one.returncode == 0, f"one process: exit 0 ({one.stderr[-300:]!r})")
    want = json.loads(one.stdout)["results"] if one.returncode == 0 else []

    for ranks in (2, 1):
        r = run(ranks, "--prompts", prompts)
        check(r.returncode == 0, f"{ranks} ranks: exit 0 ({r.stderr[-300:]!r})")
        if r.returncode != 0:
            continue
        doc = json.loads(r.stdout)  # one document: only rank 0 printed
        got = doc["results"]
        check([x["index"] for x in got] == list(range(5)), f"{ranks} ranks: results in prompt order")
        check([(x["prompt"], x["outputs"]) for x in got] == [(x["prompt"], x["outputs"]) for x in want],
              f"{ranks} ranks: the same prompts and outputs as one process")
        s = doc["summary"]
        check(s["requests"] == 5 and s["output_tokens"] == 40, f"{ranks} ranks: the job's summary {s}")
        if ranks > 1:
            check(doc["data_parallel"] == 2 and [x["prompts"] for x in doc["ranks"]] == [[0, 3], [3, 5]],
                  f"{ranks} ranks: each rank's share {[x['prompts'] for x in doc['ranks']]}")
            check(r.stderr.count("infer: ") == 1 and "data parallel over 2 ranks: 5 requests" in r.stderr,
                  f"{ranks} ranks: one summary line ({r.stderr[-400:]!r})")

    # More ranks than prompts: rank 1 has none and still takes part in the gathering.
    r = run(2, "The capital of France is")
    check(r.returncode == 0 and json.loads(r.stdout)["results"][0]["outputs"] == want[0]["outputs"] if want else False,
          f"2 ranks, 1 prompt: rank 0's result ({r.stderr[-300:]!r})")

    # An error on the ranks ends the job with its message, not a hang.
    r = run(2, "--prompts", os.path.join(tmp, "missing.txt"))
    check(r.returncode != 0 and "cannot read --prompts" in r.stderr, f"a missing prompts file: the job ends ({r.stderr[-300:]!r})")

    # infer-offline-batch: the job's one summary line, over both ranks, and the first answers from rank 0.
    batch = os.path.join(bin_dir, "infer-offline-batch")
    r = subprocess.run([mpiexec, "-n", "2", batch, "--data-parallel", "--model", model, "--backend", "cpu", "--prompts", "6",
                        "--max-tokens", "4", "--show", "4"], capture_output=True, text=True, timeout=300, env=env)
    check(r.returncode == 0 and r.stdout.count(" requests on the ") == 1 and
          r.stdout.startswith("6 requests on the paged engine (cpu, 2 ranks)") and r.stdout.count("\n--- ") == 4,
          f"infer-offline-batch, 2 ranks: one summary, 4 answers ({r.stdout[:300]!r}, {r.stderr[-300:]!r})")

finish()
