#!/usr/bin/env python3
"""infer-generate --tensor-parallel-size under mpirun (CPU backend), as issue 21 asks of CI: greedy tokens of a
model split over 2 ranks equal one process's (a dummy Llama shape whose heads, KV heads and MLP divide by 2, with
the default model's tokenizer), printed once by rank 0; sampled tokens with a seed equal too; infer-offline-batch
(sampled, unseeded) completes with one summary; a rank killed or stopped mid-job ends the job with a message
(the stopped one through the collectives' timeout); infer-bench-latency and infer-bench-throughput print one table
and write one record over 2 ranks; the default model refused with its numbers (9 heads, 3 KV heads
do not divide by 2); a rank count other than mpirun's refused; engine files built per rank by infer-build
--tensor-parallel-size, loaded by 2 ranks with the unsplit model's tokens, and the files refused where they do not fit.

usage: check_tensor_parallel.py BIN_DIR MODEL MPIEXEC"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from harness import check, finish

bin_dir, model, mpiexec = sys.argv[1:4]
exe = os.path.join(bin_dir, "infer-generate")
# Open MPI as root (CI's containers), oversubscribed on a 2-core machine, without the single-copy transport
# that needs ptrace rights.
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_rmaps_base_oversubscribe="1")


def run(ranks, *args):
    cmd = [exe, *args] if ranks == 0 else [mpiexec, "-n", str(ranks), exe, "--tensor-parallel-size", str(ranks), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


with tempfile.TemporaryDirectory() as tmp:
    # SmolLM2's vocabulary and tokenizer on a small Llama shape: 4 heads, 2 KV heads, an MLP of 256.
    config = os.path.join(tmp, "config.json")
    with open(config, "w", encoding="utf-8") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152,
                   "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
                   "rope_theta": 10000.0, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2}, f)
    prompts = os.path.join(tmp, "prompts.txt")
    with open(prompts, "w", encoding="utf-8") as f:
        f.write("The capital of France is\nWrite a haiku about the sea\nOne two three\n")
    common = ["--dummy", config, "--tokenizer", model, "--backend", "cpu", "--ignore-eos", "--max-tokens", "12",
              "--json", "--prompts", prompts]
    greedy = None  # one process's greedy tokens
    for label, extra in (("greedy", ["--temperature", "0"]), ("sampled, seed 7", ["--temperature", "0.8", "--seed", "7"])):
        one = run(0, *common, *extra)
        check(one.returncode == 0, f"{label}: one process exits 0 ({one.stderr[-300:]!r})")
        two = run(2, *common, *extra)
        check(two.returncode == 0, f"{label}: 2 ranks exit 0 ({two.stderr[-300:]!r})")
        if one.returncode != 0 or two.returncode != 0:
            continue
        want = [x["outputs"][0]["token_ids"] for x in json.loads(one.stdout)["results"]]
        greedy = want if label == "greedy" else greedy
        doc = json.loads(two.stdout)  # one document: only rank 0 printed
        got = [x["outputs"][0]["token_ids"] for x in doc["results"]]
        check(got == want, f"{label}: TP = 2 tokens equal TP = 1 ({got} vs {want})")
        check(all(len(t) == 12 for t in got), f"{label}: 12 tokens each")

    # Without a seed every rank still samples the same tokens (rank 0's seed): the job completes.
    r = run(2, *common, "--temperature", "1.0")
    check(r.returncode == 0 and all(x["outputs"][0]["finish_reason"] == "length" for x in json.loads(r.stdout)["results"])
          if r.returncode == 0 else False, f"unseeded sampling on 2 ranks completes ({r.stderr[-300:]!r})")

    # Engine files per rank, TensorRT-LLM's flow: infer-build --tensor-parallel-size 2 writes each rank's file (one
    # process, no mpirun); every rank is given the same --engine-file and loads its own; the tokens are the
    # unsplit model's (f32 on the CPU splits exactly).
    engine = os.path.join(tmp, "split.engine")
    build = [os.path.join(bin_dir, "infer-build"), "--dummy", config, "--tokenizer", model, "--backend", "cpu"]
    r = subprocess.run([*build, "--tensor-parallel-size", "2", "--output", engine],
                       capture_output=True, text=True, timeout=300, env=env)
    ranks = [os.path.join(tmp, f"split.tp2-rank{k}.engine") for k in (0, 1)]
    check(r.returncode == 0 and all(os.path.exists(f) for f in ranks) and not os.path.exists(engine)
          and "(tensor-parallel rank 1 of 2)" in r.stdout,
          f"infer-build --tensor-parallel-size 2 writes one file per rank ({r.returncode}, {r.stdout[-300:]!r} "
          f"{r.stderr[-300:]!r})")
    from_files = ["--engine-file", engine, "--ignore-eos", "--max-tokens", "12", "--json", "--prompts", prompts,
                  "--temperature", "0"]
    r = run(2, *from_files)
    got = [x["outputs"][0]["token_ids"] for x in json.loads(r.stdout)["results"]] if r.returncode == 0 else None
    check(greedy is not None and got == greedy,
          f"2 ranks on their engine files: the greedy tokens of one process on the model ({r.stderr[-300:]!r})")
    r = run(0, "--engine-file", ranks[0], "--max-tokens", "2", "Hello")
    check(r.returncode != 0 and "holds rank 0 of a 2-way tensor-parallel split" in r.stderr and "mpirun -np 2" in r.stderr,
          f"one rank's file in one process is refused, saying how to run it ({r.returncode}, {r.stderr[-300:]!r})")
    whole = os.path.join(tmp, "whole.engine")
    r = subprocess.run([*build, "--output", whole], capture_output=True, text=True, timeout=300, env=env)
    check(r.returncode == 0, f"infer-build of the whole model ({r.stderr[-300:]!r})")
    r = run(2, "--engine-file", whole, "--max-tokens", "2", "Hello")
    check(r.returncode != 0 and "whole.tp2-rank0.engine" in r.stderr
          and "infer-build --tensor-parallel-size 2" in r.stderr,
          f"2 ranks given a whole model's file are told to build the ranks' files ({r.returncode}, {r.stderr[-300:]!r})")
    r = subprocess.run([mpiexec, "-n", "2", *build, "--tensor-parallel-size", "2", "--output", engine],
                       capture_output=True, text=True, timeout=120, env=env)
    check(r.returncode == 2 and "not under mpirun" in r.stderr,
          f"infer-build under mpirun is refused ({r.returncode}, {r.stderr[-300:]!r})")

    # The offline batch job (sampled, unseeded): every rank samples what rank 0 does; one summary, from rank 0.
    r = subprocess.run([mpiexec, "-n", "2", os.path.join(bin_dir, "infer-offline-batch"), "--tensor-parallel-size", "2",
                        "--dummy", config, "--tokenizer", model, "--backend", "cpu", "--prompts", "4",
                        "--max-tokens", "8", "--show", "1"], capture_output=True, text=True, timeout=300, env=env)
    check(r.returncode == 0 and r.stdout.count(" requests on the ") == 1 and "4 requests" in r.stdout
          and "tensor parallel over 2 ranks" in r.stdout,
          f"infer-offline-batch over 2 ranks: one summary ({r.returncode}, {r.stdout[-300:]!r} {r.stderr[-300:]!r})")

    # The bench programs over 2 ranks: one table and one record, rank 0's, of the model split in two.
    for bench, extra in (("infer-bench-latency", ["--batch-size", "2", "--input-len", "16", "--output-len", "8",
                                                  "--num-iters", "1"]),
                         ("infer-bench-throughput", ["--num-prompts", "6", "--input-len", "16", "--output-len", "8"])):
        record = os.path.join(tmp, bench + ".json")
        r = subprocess.run([mpiexec, "-n", "2", os.path.join(bin_dir, bench), "--tensor-parallel-size", "2",
                            "--dummy", config, "--backend", "cpu", "--output-json", record, *extra],
                           capture_output=True, text=True, timeout=300, env=env)
        doc = json.load(open(record, encoding="utf-8")) if r.returncode == 0 and os.path.exists(record) else {}
        check(r.returncode == 0 and r.stdout.count(f"{bench}: ") == 1
              and doc.get("settings", {}).get("tensor_parallel_size") == 2,
              f"{bench} over 2 ranks: one table, a record saying TP = 2 ({r.returncode}, {r.stdout[-300:]!r} "
              f"{r.stderr[-300:]!r})")

    # A rank that dies mid-job (SIGKILL) or stops answering (SIGSTOP): the job ends with a message, the second well
    # within the collective timeout (rank 0's collective gives up after INFER_DIST_TIMEOUT_S and ends the job).
    def rank_pid(rank, launched_after):
        """The pid of this job's rank `rank` (its environment says so), once it has used a second of CPU."""
        deadline = time.time() + 120
        while time.time() < deadline:
            for d in os.listdir("/proc"):
                if not d.isdigit():
                    continue
                try:
                    with open(f"/proc/{d}/cmdline", "rb") as f:
                        cmd = f.read().split(b"\0")
                    with open(f"/proc/{d}/environ", "rb") as f:
                        environ = f.read().split(b"\0")
                    with open(f"/proc/{d}/stat", "rb") as f:
                        stat = f.read().rsplit(b")", 1)[1].split()
                except OSError:
                    continue
                cpu_s = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
                if (config.encode() in cmd and f"OMPI_COMM_WORLD_RANK={rank}".encode() in environ
                        and os.stat(f"/proc/{d}").st_mtime >= launched_after - 1 and cpu_s > 1.0):
                    return int(d)
            time.sleep(0.1)
        return None

    for how, sig in (("killed", signal.SIGKILL), ("stopped", signal.SIGSTOP)):
        start = time.time()
        job = subprocess.Popen([mpiexec, "-n", "2", os.path.join(bin_dir, "infer-offline-batch"),
                                "--tensor-parallel-size", "2", "--dummy", config, "--tokenizer", model, "--backend", "cpu",
                                "--prompts", "64", "--max-tokens", "400"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=dict(env, INFER_DIST_TIMEOUT_S="5"))
        pid = rank_pid(1, start)
        check(pid is not None, f"{how}: rank 1 found, computing")
        if pid is None:
            job.kill()
            job.communicate()
            continue
        os.kill(pid, sig)
        hit = time.time()
        try:
            out, err = job.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            job.kill()
            out, err = job.communicate()
        took = time.time() - hit
        said = ("rank 1" in err and "signal 9" in err) if sig == signal.SIGKILL else \
            "rank 0 of 2" in err and "did not complete within 5 s" in err
        check(job.returncode != 0 and said and took < 60,
              f"a {how} rank ends the job in {took:.1f} s with a message (exit {job.returncode}): {err[-400:]!r}")

    # The default model: 9 heads and 3 KV heads do not split over 2 ranks.
    r = run(2, "--model", model, "--backend", "cpu", "--max-tokens", "2", "Hello")
    check(r.returncode != 0 and "3 KV heads" in r.stderr and "9 attention heads" in r.stderr,
          f"SmolLM2 over 2 ranks is refused with its numbers ({r.returncode}, {r.stderr[-300:]!r})")

    # mpirun's rank count must be the size asked for.
    r = subprocess.run([mpiexec, "-n", "2", exe, "--tensor-parallel-size", "4", *common, "--temperature", "0"],
                       capture_output=True, text=True, timeout=120, env=env)
    check(r.returncode != 0 and "needs as many ranks" in r.stderr,
          f"--tensor-parallel-size 4 under 2 ranks is refused ({r.returncode}, {r.stderr[-300:]!r})")

finish()
