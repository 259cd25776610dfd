import time, torch
def stock(x, buffer_size=250000000):
    norm = None
    for part in x.view(-1).split(buffer_size):
        if norm is None: norm = part.data.to(torch.float64).norm(2) ** 2.0
        else: norm += part.data.to(torch.float64).norm(2) ** 2.0
    return norm ** 0.5
def fused(x, buffer_size=250000000):
    norm = None
    for part in x.view(-1).split(buffer_size):
        v = torch.linalg.vector_norm(part, 2, dtype=torch.float64) ** 2.0
        norm = v if norm is None else norm + v
    return norm ** 0.5
torch.manual_seed(0)
same = 0; total = 0
for n in [1, 7, 31, 1000, 4095, 65537, 2_359_296, 4_194_304, 16_777_216, 38_597_376, 65_536_000]:
    for trial in range(3):
        x = torch.randn(n) * (10 ** trial)
        a, b = stock(x), fused(x)
        total += 1; same += int(a.item() == b.item())
        if a.item() != b.item(): print("differs", n, trial, a.item(), b.item())
print(f"bit-equal {same}/{total}")
x = torch.randn(65_536_000)
for f in (stock, fused, stock, fused):
    t = time.perf_counter(); f(x); print(f.__name__, round(time.perf_counter() - t, 3))
