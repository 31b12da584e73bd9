"""torch.compile with the tensortune backend, as the tests compile models."""
import torch


def compiled(model, db: str, graph: str = "eager"):
    """`model` compiled afresh (Dynamo's caches are process-wide) with the tuned kernels of `db`. The graph around
    the tuned ops runs as PyTorch's own ops unless a test asks for Inductor's: Inductor's code generation costs
    seconds a model (a two-layer BERT of 32 wide compiled in 5.6-7.1 s with it, 2.8-3.0 s without, on a Zen 3),
    and what it does with tuned ops is tests/test_inductor.py's, and the tests' parametrized over `graph`."""
    torch._dynamo.reset()
    return torch.compile(model, backend="tensortune", options={"db": db, "graph": graph})
