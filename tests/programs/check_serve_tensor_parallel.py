#!/usr/bin/env python3
"""mpirun -np 2 infer-serve --tensor-parallel-size 2 (CPU backend), as issue 21 asks: rank 0 serves HTTP, rank 1
runs rank 0's engine steps on its shard of the model (dist/lockstep_engine.hpp). On a dummy Llama shape whose heads
divide by 2, with the default model's tokenizer:
  - greedy completions, sent at once, equal one process's infer-generate text for the same prompts;
  - sampled requests without a seed (n = 2) complete: every rank samples what rank 0 does, or the step fails;
  - a prompt long enough to take the second broadcast of a step's record;
  - a refused request (top_p = 0) is a 400 and the ranks go on; a client that hangs up mid-stream is aborted on
    both ranks and the KV cache empties;
  - SIGTERM to rank 0 drains, stops rank 1 through rank 0, and the job exits 0; SIGTERM to mpirun ends the job (Open
    MPI kills the ranks a second later) and leaves no rank behind;
  - --tensor-parallel-size with --data-parallel-size is refused.

usage: check_serve_tensor_parallel.py BIN_DIR MODEL MPIEXEC"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading

from harness import check, finish
from serve_harness import HOST, Server

bin_dir, model, mpiexec = sys.argv[1:4]
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_rmaps_base_oversubscribe="1")
PROMPTS = ["The capital of France is", "Write a haiku about the sea", "One two three"]

with tempfile.TemporaryDirectory() as tmp:
    config = os.path.join(tmp, "config.json")
    with open(config, "w", encoding="utf-8") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152,
                   "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
                   "rope_theta": 10000.0, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2}, f)
    model_args = ["--dummy", config, "--tokenizer", model, "--backend", "cpu", "--kv-cache-memory", "64M"]

    # One process, the whole model: the text greedy decoding must give.
    prompts_file = os.path.join(tmp, "prompts.txt")
    with open(prompts_file, "w", encoding="utf-8") as f:
        f.write("\n".join(PROMPTS) + "\n")
    one = subprocess.run([os.path.join(bin_dir, "infer-generate"), *model_args, "--temperature", "0", "--ignore-eos",
                          "--max-tokens", "12", "--json", "--prompts", prompts_file],
                         capture_output=True, text=True, timeout=300)
    check(one.returncode == 0, f"infer-generate on one process ({one.stderr[-300:]!r})")
    want = [x["outputs"][0]["text"] for x in json.loads(one.stdout)["results"]] if one.returncode == 0 else []

    s = Server(bin_dir, None, "--tensor-parallel-size", "2", *model_args,
               launcher=[mpiexec, "-n", "2"], env=env)
    with s:
        # ---- greedy, concurrent: one batch on both ranks -----------------------------------------------------
        got = [None] * len(PROMPTS)

        def complete(i):
            st, _, c = s.post("/v1/completions", {"prompt": PROMPTS[i], "max_tokens": 12, "temperature": 0,
                                                  "ignore_eos": True})
            got[i] = c["choices"][0]["text"] if st == 200 else (st, c)
        threads = [threading.Thread(target=complete, args=(i,)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        check(got == want, f"TP = 2 greedy texts equal one process's: {got} vs {want}")

        # ---- sampled without a seed, two samples each --------------------------------------------------------
        st, _, c = s.post("/v1/completions", {"prompt": PROMPTS[:2], "max_tokens": 16, "temperature": 1.0, "n": 2,
                                              "ignore_eos": True})
        check(st == 200 and len(c["choices"]) == 4 and all(x["finish_reason"] == "length" for x in c["choices"]),
              f"unseeded sampling, n = 2, completes on both ranks: {st} {str(c)[:300]}")

        # ---- a long prompt: its record takes a step's second broadcast (past 4096 bytes) -----------------------
        st, _, c = s.post("/v1/completions", {"prompt": "word " * 1500, "max_tokens": 4, "temperature": 0})
        check(st == 200 and c["usage"]["prompt_tokens"] > 1024, f"a 1500-word prompt is served: {st} {str(c)[:200]}")

        # ---- refused here, never sent; a client that hangs up is aborted everywhere ----------------------------
        st, _, c = s.post("/v1/completions", {"prompt": "x", "max_tokens": 4, "top_p": 0})
        check(st == 400, f"top_p = 0 is refused: {st} {str(c)[:200]}")
        body = json.dumps({"prompt": "Tell me a long story", "max_tokens": 1500, "ignore_eos": True,
                           "stream": True}).encode()
        sock = socket.create_connection((HOST, s.port), timeout=60)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        seen = b""
        while b"data: " not in seen:  # running: a token arrived
            seen += sock.recv(4096)
        sock.close()
        usage = s.wait_metric("infer:kv_cache_usage_perc", lambda v: v == 0, timeout=60)
        aborted = s.wait_metric("infer:request_success_total", lambda v: v >= 1, timeout=60, finished_reason="abort")
        check(usage == 0 and aborted == 1, f"the hung-up stream is aborted (aborts {aborted}), KV usage {usage}")
        st, _, c = s.post("/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0,
                                              "ignore_eos": True})
        check(st == 200 and want and c["choices"][0]["text"] == want[0], "the ranks still agree afterwards")

        # ---- SIGTERM to rank 0 (the pid it prints): it drains and stops rank 1; the job exits 0 -------------------
        m = re.search(r"rank 0 \(this process, pid (\d+)\)", s.output())
        check(m is not None, "rank 0 prints its pid")
        if m:
            os.kill(int(m.group(1)), signal.SIGTERM)
        code = s.wait_exit(timeout=90)
        out = s.output()
        check(code == 0 and "infer-serve: stopped" in out and "error" not in out.lower(),
              f"SIGTERM to rank 0 ends the job cleanly (exit {code}): {out[-600:]!r}")

    # mpirun's own SIGTERM (Ctrl-C): Open MPI ends every rank a second later, drained or not; none is left behind.
    s = Server(bin_dir, None, "--tensor-parallel-size", "2", *model_args, launcher=[mpiexec, "-n", "2"], env=env)
    with s:
        code = s.terminate(timeout=60)
        left = subprocess.run(["pgrep", "-f", config], capture_output=True, text=True).stdout.split()
        check(code is not None and not left, f"SIGTERM to mpirun ends the job ({code}), no rank left: {left}")

    r = subprocess.run([mpiexec, "-n", "2", os.path.join(bin_dir, "infer-serve"), "--tensor-parallel-size", "2",
                        "--data-parallel-size", "2", *model_args, "--port", "0"],
                       capture_output=True, text=True, timeout=120, env=env)
    check(r.returncode != 0 and "without --data-parallel-size" in r.stderr,
          f"--tensor-parallel-size with --data-parallel-size is refused ({r.returncode}, {r.stderr[-300:]!r})")

finish()
