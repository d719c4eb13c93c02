"""PyTorch steps for `cargo xtask gpu-check`: the driver calls an engine's runtime makes
(cudart resolves the driver's entry points through cuGetProcAddress; cuBLAS launches its
kernels itself). Two phases of STEPS steps, each step as an engine runs one (forward,
sample, token ids copied to the host, wait): eager, ending with a device synchronize
(cuCtxSynchronize_v2 on CUDA 13), and replayed from a CUDA graph as engines decode,
ending with a stream synchronize. Prints one line per phase; without torch, or without a
GPU torch can see, each says skipped and why."""
import sys

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 50
try:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no GPU")
except Exception as e:  # ImportError, or a torch built without CUDA
    print(f"workload: torch eager: skipped ({e})")
    print(f"workload: torch graphs: skipped ({e})")
    sys.exit(0)

a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
b = torch.randn_like(a)
host = torch.empty(64, dtype=torch.int64, pin_memory=True)
torch.cuda.synchronize()
# A step as an engine runs one: forward, sample, copy the token ids to the host, wait.
for _ in range(steps):
    ids = torch.relu(a @ b).argmax(-1)[:64]
    host.copy_(ids, non_blocking=True)
    torch.cuda.synchronize()
print(f"workload: torch eager: {steps} steps of a bf16 matmul + argmax, ids copied, device sync (torch {torch.__version__})")

try:
    stream = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(stream)
    with torch.cuda.stream(side):
        for _ in range(3):
            ids = (a @ b).argmax(-1)[:64]
    stream.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ids = (a @ b).argmax(-1)[:64]
    for _ in range(steps):
        graph.replay()
        host.copy_(ids, non_blocking=True)
        stream.synchronize()
    print(f"workload: torch graphs: {steps} steps of a captured matmul + argmax replayed, ids copied, stream sync")
except Exception as e:
    print(f"workload: torch graphs: skipped ({e})")
