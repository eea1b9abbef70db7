#!/usr/bin/env python3
"""The MLP block as a PyTorch user writes it, timed, to check graph_bench's baseline.

The issue's bar compares loom's MLP block with "the baseline a PyTorch user
gets". graph_bench builds that baseline itself (cublasLt GEMMs, its own
SwiGLU kernel, one CUDA graph); this script times what PyTorch itself runs
for the same block on the same GPU, so the two can be put side by side:

  y = silu(x W_gate^T) * (x W_up^T) W_down^T + x

in two spellings, each captured in one CUDA graph:
  merged    one [2 * intermediate, hidden] gate/up weight, F.linear, chunk,
            F.silu(gate) * up, torch.addmm(x, h, W_down^T)
  separate  gate and up as two F.linear calls (the Hugging Face Llama MLP),
            then F.linear(h, W_down) + x

Weights are uniform [-1, 1) bf16 like graph_bench's; 352 MB at hidden 4096 /
intermediate 14336, so no launch finds them in the 60 MB L2. Medians of
--iters graph replays timed with CUDA events after --warmup replays.

Needs a CUDA GPU and PyTorch (both on the H200 the `device` tool lends; not
part of the build, the tests or CI):
  python3 bench/torch_mlp_baseline.py --tokens 1,16,64,128,8192
"""

import argparse
import statistics

import torch
import torch.nn.functional as F


def time_graph(graph, iters, warmup):
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)  # us
    return statistics.median(times)


def capture(fn):
    # Capture on a side stream after one eager run (PyTorch's recipe: the run
    # initialises cuBLAS handles and workspaces outside the capture).
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def uniform(*shape):
    return (torch.rand(*shape, device="cuda", dtype=torch.float32) * 2 - 1).to(torch.bfloat16)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="1,16,64,128,8192")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--intermediate", type=int, default=14336)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("torch_mlp_baseline: no CUDA GPU (this script times PyTorch on one)")

    hidden, inter = args.hidden, args.intermediate
    torch.manual_seed(0)
    w_gate_up = uniform(2 * inter, hidden)
    w_gate, w_up = w_gate_up[:inter], w_gate_up[inter:]
    w_down = uniform(hidden, inter)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, hidden {hidden}, intermediate {inter}")
    print("tokens  merged_us  separate_us")
    for tokens in (int(t) for t in args.tokens.split(",")):
        x = uniform(tokens, hidden)

        def merged():
            gate, up = F.linear(x, w_gate_up).chunk(2, dim=-1)
            return torch.addmm(x, F.silu(gate) * up, w_down.t())

        def separate():
            return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down) + x

        # The two spellings agree (a check that each graph computes the block).
        y_merged, y_separate = merged(), separate()
        torch.cuda.synchronize()
        difference = (y_merged.float() - y_separate.float()).norm() / y_separate.float().norm()
        if not difference < 1e-2:
            raise SystemExit(f"torch_mlp_baseline: the two spellings disagree at {tokens} tokens "
                             f"(relative difference {difference:.3g})")
        row = [time_graph(capture(fn), args.iters, args.warmup) for fn in (merged, separate)]
        print(f"{tokens:6d}  {row[0]:9.1f}  {row[1]:11.1f}", flush=True)


if __name__ == "__main__":
    main()
