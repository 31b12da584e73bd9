"""Graph rewrites before matching (frontend/rewrites.py): scaled_dot_product_attention as two tuned batch matmuls,
Q, K and V as one dense, baddbmm as a bmm; on transformers models in small configs (random weights, default
sdpa attention) and on single ops, each against what eager PyTorch computes."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from frontend import extract_tasks
from frontend.capture import Captured, capture
from frontend.rewrites import rewrite
from search_space import batch_matmul, dense
from tests.compile_helpers import compiled

transformers = pytest.importorskip("transformers")


def bert():
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                     vocab_size=100, max_position_embeddings=64)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0  # the second sequence is padded
    return transformers.BertModel(config), (torch.randint(0, 100, (2, 8)), mask)


def distilbert():
    config = transformers.DistilBertConfig(dim=32, n_layers=2, n_heads=2, hidden_dim=64, vocab_size=100,
                                           max_position_embeddings=64)
    return transformers.DistilBertModel(config), (torch.randint(0, 100, (2, 8)),)


def vit():
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                    image_size=16, patch_size=4)
    return transformers.ViTModel(config), (torch.randn(2, 3, 16, 16),)


def gpt2():
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100, n_positions=64, bos_token_id=0,
                                     eos_token_id=0)
    return transformers.GPT2LMHeadModel(config), (torch.randint(0, 100, (1, 8)),)


# model → (rows of the QKV dense, sequence length, each layer's attention module and QKV path, the strides the
# products read q, kᵀ and v through, in place, and the sequences: the fused QKV dense's result holds each row's heads
# of 16 in 96 columns; in a batch of 2 sequences the batch and the heads do not flatten into one stride, so the
# kernel's batch is the 2 heads, called once a sequence; GPT-2 reads its one sequence's kᵀ and v from its cache)
HEADS = ("16:96:1", "16:1:96", "16:96:1")
MODELS = {
    bert: (16, 8, lambda layer: (f"encoder.layer.{layer}.attention.self",) * 2, HEADS, 2),
    distilbert: (16, 8, lambda layer: (f"transformer.layer.{layer}.attention",) * 2, HEADS, 2),
    vit: (34, 17, lambda layer: (f"layers.{layer}.attention",) * 2, HEADS, 2),
    gpt2: (8, 8, lambda layer: (f"transformer.h.{layer}.attn", f"transformer.h.{layer}.attn.c_attn"),
           ("16:96:1", "128:1:16", ""), 1),
}


def tiny(build):
    torch.manual_seed(0)
    model, inputs = build()
    return model.eval(), inputs


@pytest.mark.parametrize("build", MODELS, ids=lambda build: build.__name__)
def test_qkv_dense_and_both_attention_matmuls_of_every_layer_are_tasks(build):
    rows, length, paths, (q, k, v), sequences = MODELS[build]
    tasks = {task.workload: task for task in extract_tasks(*tiny(build))}
    attention, qkv = zip(*(paths(layer) for layer in range(2)))
    assert tasks[dense(rows, 96, 32, bias=True)].paths == qkv
    scores = tasks[batch_matmul(2, length, length, 16, a_strides=q, b_strides=k)]  # q · kᵀ
    assert (scores.paths, scores.weight) == (attention, 2 * sequences)  # a call a sequence in each layer
    assert tasks[batch_matmul(2, length, 16, length, b_strides=v)].paths == attention  # softmax · v


@pytest.mark.parametrize("build", MODELS, ids=lambda build: build.__name__)
def test_compiled_model_computes_what_eager_does(build, tmp_path):
    model, inputs = tiny(build)
    with torch.inference_mode():
        expected, got = model(*inputs)[0], compiled(model, f"sqlite:///{tmp_path}/empty.db")(*inputs)[0]
    assert torch.allclose(got, expected, atol=1e-5)


def test_rewritten_graph_with_symbolic_sizes_computes_what_the_original_does():
    """Dynamo traces with symbolic batch and sequence sizes: the rewrite must neither fail nor specialize them,
    and one graph serves two sequence lengths."""
    model, (ids, mask) = tiny(bert)
    graphs = []

    def rewritten(graph, inputs):
        rewrite(Captured(graph, list(inputs)))
        graphs.append(graph)
        return graph.forward

    torch._dynamo.reset()
    forward = torch.compile(model, backend=rewritten, dynamic=True)
    with torch.inference_mode():
        for length in (8, 11):
            ids, mask = torch.randint(0, 100, (2, length)), torch.ones(2, length, dtype=torch.long)
            mask[0, length - 3:] = 0
            assert torch.allclose(forward(ids, mask)[0], model(ids, mask)[0], atol=1e-5)
    [graph] = graphs
    targets = [node.target for node in graph.graph.nodes]
    assert F.scaled_dot_product_attention not in targets and targets.count(torch.split) == 2


class Attention(nn.Module):
    def __init__(self, **options):
        super().__init__()
        self.options = options

    def forward(self, q, k, v, *mask):
        return F.scaled_dot_product_attention(q, k, v, *mask, **self.options)


def masks():
    """A boolean mask hiding the whole of query row 1 (SDPA gives it zeros, a plain softmax NaN) and some keys,
    and the same as a float mask of -inf."""
    hidden = torch.zeros(2, 1, 5, 7, dtype=torch.bool)
    hidden[:, :, 1], hidden[1, :, :, 4:] = True, True
    return ~hidden, torch.zeros(2, 1, 5, 7).masked_fill(hidden, float("-inf"))


@pytest.mark.parametrize("options, mask", [({}, masks()[0]), ({}, masks()[1]), ({"is_causal": True}, None),
                                           ({"scale": 0.3}, None)], ids=["bool-mask", "float-mask", "causal", "scale"])
def test_attention_is_two_batch_matmuls_and_computes_sdpa(options, mask, tmp_path):
    """5 queries, 7 keys: a causal mask aligned top-left, as SDPA aligns it, differs from one aligned bottom-right."""
    torch.manual_seed(0)
    inputs = (torch.randn(2, 3, 5, 16), torch.randn(2, 3, 7, 16), torch.randn(2, 3, 7, 8))
    inputs += (mask,) if mask is not None else ()
    model = Attention(**options)
    # q · kᵀ (kᵀ read in place), softmax · v
    products = {batch_matmul(6, 5, 7, 16, b_strides="112:1:16"), batch_matmul(6, 5, 8, 7)}
    assert {task.workload for task in extract_tasks(model, inputs)} == products
    with torch.inference_mode():
        expected = F.scaled_dot_product_attention(*inputs, **options)
        got = compiled(model, f"sqlite:///{tmp_path}/empty.db")(*inputs)
    assert not expected.isnan().any() and torch.allclose(got, expected, atol=1e-5)


class TwoAttentions(nn.Module):
    """Two attentions under one boolean mask, as a transformer's layers are."""

    def forward(self, q, k, v, mask):
        first = F.scaled_dot_product_attention(q, k, v, mask)
        return F.scaled_dot_product_attention(first, k, v, mask)


def test_a_boolean_mask_is_made_a_bias_once_for_every_attention_reading_it(tmp_path):
    """Inductor fused a boolean mask's expression into each softmax and computed it in each of its passes: the
    mask is one `attention_bias` call (0 kept, -inf hidden) that both layers' scores add; the hidden row still
    gives zeros."""
    torch.manual_seed(0)
    inputs = (torch.randn(2, 3, 5, 16), torch.randn(2, 3, 7, 16), torch.randn(2, 3, 7, 16), masks()[0])
    [captured] = capture(TwoAttentions(), inputs)
    rewrite(captured)
    [bias] = [node for node in captured.graph.graph.nodes if node.target == torch.ops.tensortune.attention_bias.default]
    assert len(bias.users) == 2 and all(user.target is torch.add for user in bias.users)
    expected = TwoAttentions()(*inputs)
    with torch.inference_mode():
        got = compiled(TwoAttentions(), f"sqlite:///{tmp_path}/empty.db")(*inputs)
    assert not expected.isnan().any() and torch.allclose(got, expected, atol=1e-5)


class Baddbmm(nn.Module):
    def __init__(self, beta: float, alpha: float):
        super().__init__()
        self.beta, self.alpha = beta, alpha

    def forward(self, base, first, second):
        return torch.baddbmm(base, first, second, beta=self.beta, alpha=self.alpha)


@pytest.mark.parametrize("beta, alpha", [(0.5, 2.0), (0.0, 1.0)])
def test_baddbmm_is_a_batch_matmul_with_its_scaling_beside_it(beta, alpha, tmp_path):
    """With beta 0, baddbmm ignores its input, NaN included."""
    torch.manual_seed(0)
    base = torch.randn(1, 6, 10) if beta else torch.full((1, 6, 10), float("nan"))
    inputs, model = (base, torch.randn(4, 6, 12), torch.randn(4, 12, 10)), Baddbmm(beta, alpha)
    assert [task.workload for task in extract_tasks(model, inputs)] == [batch_matmul(4, 6, 10, 12)]
    with torch.inference_mode():
        expected, got = model(*inputs), compiled(model, f"sqlite:///{tmp_path}/empty.db")(*inputs)
    assert not expected.isnan().any() and torch.allclose(got, expected, atol=1e-5)


class Projections(nn.Module):
    """Three linear layers reading one activation, one without a bias, whose results are read as the fused
    result's slices could not be (a view merging the last dimension, the graph's output); a fourth whose relu
    is fused into it, not into the group."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(24, 16), nn.Linear(24, 8, bias=False), nn.Linear(24, 12)
        self.gate = nn.Linear(24, 4)

    def forward(self, x):
        heads = self.q(x).view(2, 5, 2, 8).transpose(1, 2)
        return heads.sum(-1), self.k(x).view(-1), self.v(x), torch.relu(self.gate(x))


def test_linears_reading_one_activation_are_one_dense(tmp_path):
    torch.manual_seed(0)
    model, x = Projections().eval(), torch.randn(2, 5, 24)
    assert {task.workload for task in extract_tasks(model, (x,))} == {
        dense(10, 36, 24, bias=True), dense(10, 4, 24, bias=True, epilogue="relu")}
    with torch.inference_mode():
        expected, got = model(x), compiled(model, f"sqlite:///{tmp_path}/empty.db")(x)
    assert all(torch.allclose(one, other, atol=1e-5) for one, other in zip(got, expected))


def test_rewriting_twice_changes_nothing_more():
    [captured] = capture(*tiny(bert))
    rewrite(captured)
    once = captured.graph.code
    rewrite(captured)
    assert captured.graph.code == once and "split" in once
