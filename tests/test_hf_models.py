"""Models as users bring them (Hugging Face transformers, random weights, nothing downloaded): every form of
linear layer becomes a task, GPT-2's written-out tanh GELU is fused, and the compiled model computes what
eager PyTorch does, its gradients included, at every sequence length and batch size."""
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from frontend import extract_tasks
from search_space import batch_matmul, dense
from tests.compile_helpers import compiled
from tests.test_frontend import frontend_lines, recording_compile, tuned_ops

transformers = pytest.importorskip("transformers")
from transformers.activations import GELUTanh, NewGELUActivation  # below the skip: where transformers is absent
from transformers.pytorch_utils import Conv1D


def tiny_gpt2():
    """GPT-2 at 32 wide, 2 layers of 2 heads: 8 Conv1D layers (addmm, weight stored [in, out]) and the lm_head."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval(), (torch.randint(0, 100, (1, 16)),)


def test_gpt2_tasks_are_every_conv1d_and_the_lm_head():
    tasks = {task.workload: task for task in extract_tasks(*tiny_gpt2())}
    assert {workload: task.weight for workload, task in tasks.items()} == {
        dense(16, 96, 32, bias=True): 2, dense(16, 32, 32, bias=True): 2,
        dense(16, 128, 32, bias=True, epilogue="gelu"): 2, dense(16, 32, 128, bias=True): 2, dense(16, 100, 32): 1,
        # q·kᵀ and softmax·v of each block's attention (16 positions, 16 per head), q read in place from c_attn's
        # result, kᵀ from the key cache
        batch_matmul(2, 16, 16, 16, a_strides="16:96:1", b_strides="256:1:16"): 2, batch_matmul(2, 16, 16, 16): 2}
    assert tasks[dense(16, 128, 32, bias=True, epilogue="gelu")].paths == ("transformer.h.0.mlp.c_fc",
                                                                           "transformer.h.1.mlp.c_fc")
    assert tasks[dense(16, 100, 32)].paths == ("lm_head",)


def test_gpt2_compiled_computes_what_eager_does(tmp_path):
    model, inputs = tiny_gpt2()
    with torch.inference_mode():
        expected = model(*inputs).logits
        got = compiled(model, f"sqlite:///{tmp_path}/empty.db", "inductor")(*inputs).logits
    assert torch.allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("activation", [NewGELUActivation, GELUTanh], ids=["written-out", "F.gelu-tanh"])
def test_tanh_gelu_is_fused_into_the_conv1d_and_computes_it(activation, tmp_path):
    """Pre-activations over about [-4.5, 4], where the tanh form and PyTorch's exact GELU differ by up to
    4.7e-4 (near ±2.7): a kernel fusing the exact one is seen."""
    torch.manual_seed(0)
    layer = Conv1D(64, 4)
    layer.weight.data = torch.linspace(-3, 3, 4 * 64).reshape(4, 64)
    model, x = nn.Sequential(layer, activation()).eval(), torch.rand(3, 8, 4) * 2 - 1
    assert [task.workload for task in extract_tasks(model, (x,))] == [dense(24, 64, 4, bias=True, epilogue="gelu")]
    with torch.inference_mode():
        expected, pre_activation = model(x), layer(x)
        got = compiled(model, f"sqlite:///{tmp_path}/empty.db")(x)
    assert float((F.gelu(pre_activation) - expected).abs().max()) > 1e-4
    assert torch.allclose(got, expected, atol=1e-5)


class LinearForms(nn.Module):
    """Linear layers written as addmm (with and without its scale factors) and as a product by a weight."""

    def __init__(self):
        super().__init__()
        self.first, self.bias = nn.Parameter(torch.randn(24, 40)), nn.Parameter(torch.randn(40))
        self.second, self.third = nn.Parameter(torch.randn(40, 16)), nn.Parameter(torch.randn(16, 8))

    def forward(self, x):
        h = torch.relu(torch.addmm(self.bias, x.view(-1, 24), self.first)).view(2, 5, 40)  # fused through the view
        h = torch.relu(h @ self.second)  # a 3-D activation by a [K, N] weight
        scaled = torch.addmm(self.bias[:8], h.view(-1, 16), self.third, beta=0.5)  # beta ≠ 1: PyTorch runs it
        return torch.mm(h.view(-1, 16), self.third) + scaled


def test_addmm_and_products_by_a_weight_are_dense(tmp_path):
    torch.manual_seed(0)
    model, x = LinearForms().eval(), torch.randn(2, 5, 24)
    assert {task.workload for task in extract_tasks(model, (x,))} == {
        dense(10, 40, 24, bias=True, epilogue="relu"), dense(10, 16, 40, epilogue="relu"), dense(10, 8, 16)}
    with torch.inference_mode():
        expected, got = model(x), compiled(model, f"sqlite:///{tmp_path}/empty.db")(x)
    assert torch.allclose(got, expected, atol=1e-4)


def test_with_grad_enabled_every_op_runs_tuned_kernels_and_every_weight_gets_eagers_gradient(tmp_path, caplog):
    """The embeddings and the first block are frozen: its 6 ops (4 Conv1D, 2 attention matmuls) need no gradient
    and run as for inference; the second block's Conv1D (addmm by a [K, N] weight: an mm of two activations under
    grad mode), its attention and the lm_head run tuned kernels with tuned gradients, and every weight gets eager's
    gradient, none a silent None. A call under inference_mode first: Dynamo compiles anew when grad mode changes."""
    model, inputs = tiny_gpt2()
    for frozen in (model.transformer.wte, model.transformer.wpe, model.transformer.h[0]):
        frozen.requires_grad_(False)
    model(*inputs).logits.pow(2).sum().backward()
    expected = {name: parameter.grad.clone() for name, parameter in model.named_parameters() if parameter.requires_grad}
    model.zero_grad()
    forward = compiled(model, f"sqlite:///{tmp_path}/empty.db")
    with torch.inference_mode():
        forward(*inputs)
    with caplog.at_level(logging.WARNING, logger="tensortune.frontend"):
        forward(*inputs).logits.pow(2).sum().backward()
    got = {name: parameter.grad for name, parameter in model.named_parameters() if parameter.requires_grad}
    assert got.keys() == expected.keys() and all(grad is not None for grad in got.values())
    for name in expected:  # to 1e-4 of each gradient's largest
        assert torch.allclose(got[name], expected[name], rtol=0, atol=1e-4 * float(expected[name].abs().max())), name
    assert not [line for line in frontend_lines(caplog) if "run in PyTorch" in line]


def tiny_bert():
    """BERT at 32 wide, 2 layers of 2 heads, its attention written out (the batch matmuls tuned)."""
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                     vocab_size=100, max_position_embeddings=64, attn_implementation="eager")
    return transformers.BertModel(config).eval()


@pytest.mark.parametrize("graph, sequences", [("eager", 1), ("inductor", 3)])
def test_bert_reads_its_attention_heads_in_place(graph, sequences, tmp_path):
    """The heads of q, k and v are views of the fused QKV dense's result [sequences, L, 96]: both attention
    products read them where they lie (kᵀ too), their kernels' batch the 2 heads of 16 (a call a sequence where
    there are several, as sequences and heads do not flatten into one stride), at a static length and at a
    second one that makes the length symbolic, in the graph Inductor compiles and in the eager one; the outputs
    are eager's."""
    from frontend.backend import kernel_clock

    model, called = tiny_bert(), set()
    forward = compiled(model, f"sqlite:///{tmp_path}/empty.db", graph)
    with torch.inference_mode(), kernel_clock() as seconds:
        for length in (8, 12):
            ids = torch.randint(0, 100, (sequences, length))
            assert torch.allclose(forward(ids).last_hidden_state, model(ids).last_hidden_state, atol=1e-5)
            called |= {name.split()[1] for name in seconds if "batch_matmul" in name}
    assert called == {key for length in (8, 12) for key in (
        batch_matmul(2, length, length, 16, a_strides="16:96:1", b_strides="16:1:96").key,
        batch_matmul(2, length, 16, length, b_strides="16:96:1").key)}


def test_bert_runs_tuned_kernels_at_every_sequence_length_and_batch_size(tmp_path, caplog):
    """Three sequence lengths, then another batch size, in one process: Dynamo compiles a static graph, then one
    with the sequence length symbolic, then one with the batch size too; every op extract_tasks finds is tuned
    in each, none goes back to PyTorch, and the outputs are eager's."""
    model = tiny_bert()
    compiled, graphs = recording_compile(model, f"sqlite:///{tmp_path}/empty.db")
    with torch.inference_mode(), caplog.at_level(logging.INFO, logger="tensortune.frontend"):
        for batch, length in ((2, 8), (2, 12), (2, 16), (3, 12)):
            ids = torch.randint(0, 100, (batch, length))
            got, expected = compiled(ids), model(ids)
            assert torch.allclose(got.last_hidden_state, expected.last_hidden_state, atol=1e-5)
            assert torch.allclose(got.pooler_output, expected.pooler_output, atol=1e-5)
    # one sequence: each op one kernel call (in a batch, an attention product is a call a sequence)
    matched = sum(task.weight for task in extract_tasks(model, (torch.randint(0, 100, (1, 8)),)))
    assert len(graphs) == 3 and [len(tuned_ops(graph)) for graph in graphs] == [matched] * 3
    assert not [line for line in frontend_lines(caplog) if "run in PyTorch" in line]
