"""Training through tuned kernels: the gradients of a tuned op are tuned products too.

A trained linear layer is a dense whose weight and bias are activations, passed at each call (an optimizer
changes them between calls; frontend/patterns.py's trained_linear): its gradients are dY·W (x's), dYᵀ·x (W's)
and dY summed over rows (the bias's). A product of activations C = a·b has dC·bᵀ and aᵀ·dC, batch by batch.
Each product is a matmul or batch_matmul workload, tuned like any other: `gradient_workloads` reads them off the
same formulas, run on meta tensors, so extract_tasks finds for a training step exactly what its backward runs.
`differentiate` gives the differentiable tensortune operator its autograd formula, another opaque operator, so that
AOTAutograd traces a backward graph that calls the tuned products (Inductor's, or eager autograd's).
"""
from __future__ import annotations

from typing import Callable, Protocol

import torch

from search_space import Workload

from .shapes import Dense, Form, Product

Multiply = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # a · b, as a tuned product kernel computes it


def dense_gradients(form: Dense, grad: torch.Tensor, product: Multiply, x, w, bias=None) -> tuple:
    """x's, W's and the bias's, each computed when called: dY·W, dYᵀ·x, dY summed over the rows."""
    rows = grad.reshape(-1, form.N)
    return (lambda: product(rows, w).reshape(x.shape), lambda: product(rows.t(), x.reshape(-1, form.K)),
            lambda: rows.sum(0))


def product_gradients(form: Product, grad: torch.Tensor, product: Multiply, a, b) -> tuple:
    """a's and b's, each computed when called: dC·bᵀ and aᵀ·dC, batch by batch."""
    return lambda: product(grad, b.transpose(-2, -1)), lambda: product(a.transpose(-2, -1), grad)


GRADIENTS = {Dense: dense_gradients, Product: product_gradients}


def gradients(form: Form, grad: torch.Tensor, needs: tuple[bool, ...], product: Multiply, *activations) -> list:
    """The gradients of the activations that `needs` asks for, in order (None for the others)."""
    return [gradient() if need else None
            for gradient, need in zip(GRADIENTS[type(form)](form, grad, product, *activations), needs)]


def gradient_workloads(form: Form, shapes: tuple[tuple[int, ...], ...], needs: tuple[bool, ...]) -> list[Workload]:
    """The products the form's gradients run at these activation shapes, as `needs` asks for them: what a
    training step adds to the forward's tasks."""
    found, products = [], Product(form.dtype)

    def product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        found.append(products.workload(a.shape, b.shape))
        return a.new_empty(products.result_shape(a.shape, b.shape))

    meta = [torch.empty(shape, device="meta") for shape in shapes]
    gradients(form, torch.empty(form.result_shape(*shapes), device="meta"), needs, product, *meta)
    return found


class Differentiable(Protocol):
    """What autograd needs of a tuned op whose result it differentiates: which activations get gradients, and
    those gradients."""

    grads: tuple[bool, ...]

    def backward(self, grad: torch.Tensor, *activations: torch.Tensor) -> list[torch.Tensor]: ...


def differentiate(library: torch.library.Library, name: str, ops) -> None:
    """Register the autograd formula of the library's operator `name(op_id, activations)`, whose ops `ops[op_id]`
    holds: the gradients are `name_backward(op_id, grad, activations)`, an opaque operator of its own."""
    backward_name = f"{name}_backward"
    library.define(f"{backward_name}(int op_id, Tensor grad, Tensor[] activations) -> Tensor[]")
    library.impl(backward_name, lambda op_id, grad, activations: ops[op_id].backward(grad, *activations), "CPU")

    def fake(op_id: int, grad: torch.Tensor, activations: list[torch.Tensor]) -> list[torch.Tensor]:
        return [activation.new_empty(activation.shape) for activation, need in zip(activations, ops[op_id].grads)
                if need]

    torch.library.register_fake(f"{library.ns}::{backward_name}", fake, lib=library)

    def save(ctx, inputs: tuple, output: torch.Tensor):
        ctx.op_id = inputs[0]
        ctx.save_for_backward(*inputs[1])

    def backward(ctx, grad: torch.Tensor):
        op: Differentiable = ops[ctx.op_id]
        gradients = getattr(getattr(torch.ops, library.ns), backward_name).default
        computed = iter(gradients(ctx.op_id, grad, list(ctx.saved_tensors)))
        return None, [next(computed) if need else None for need in op.grads]

    torch.library.register_autograd(f"{library.ns}::{name}", backward, setup_context=save, lib=library)
