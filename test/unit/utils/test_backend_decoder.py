"""The detokenizer's transformers-free decoder: for a plain fast tokenizer it decodes exactly what the HF
tokenizer decodes (special tokens kept or skipped, split UTF-8, empty input); a tokenizer whose decoding does
more than the backend's (a subclass overriding it, a clean-up of spaces that applies) gets None and keeps the
transformers path; the detokenizer process started this way imports neither torch nor transformers."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

import os
import random
import subprocess
import sys

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from sglang.srt.utils.backend_decoder import BackendDecoder, backend_json_if_plain, remove_quietly, write_backend_json
from sglang.srt.utils.hf_tokenizer import get_tokenizer
from sglang.test.runners import SMOLLM2


@pytest.fixture(scope="module")
def smollm2():
    return get_tokenizer(SMOLLM2)


def test_decodes_exactly_as_the_hf_tokenizer(smollm2):
    backend_json = backend_json_if_plain(smollm2)
    assert backend_json is not None  # the built-in model's tokenizer takes the fast path
    decoder = BackendDecoder(backend_json)
    rng = random.Random(0)
    special = list(smollm2.all_special_ids)
    text_ids = smollm2.encode("Héllo wörld 你好 🎉, fine.\n\n<|im_start|>user x")
    cases = [[], text_ids, text_ids[:3], special + text_ids + special]
    cases += [[rng.randrange(len(smollm2)) for _ in range(rng.randrange(1, 40))] for _ in range(50)]
    for ids in cases:
        for skip in (False, True):
            for spaces in (False, True):
                want = smollm2.decode(ids, skip_special_tokens=skip, spaces_between_special_tokens=spaces)
                assert decoder.decode(ids, skip_special_tokens=skip, spaces_between_special_tokens=spaces) == want


def _word_piece(cleanup: bool) -> PreTrainedTokenizerFast:
    vocab = {"[UNK]": 0, "hello": 1, ",": 2, "world": 3, "##s": 4}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", clean_up_tokenization_spaces=cleanup)


def test_a_space_clean_up_that_applies_keeps_the_transformers_path():
    tok = _word_piece(cleanup=True)
    assert tok.decode([1, 2, 3]) != Tokenizer.from_str(tok.backend_tokenizer.to_str()).decode([1, 2, 3])
    assert backend_json_if_plain(tok) is None
    plain = _word_piece(cleanup=False)
    assert BackendDecoder(backend_json_if_plain(plain)).decode([1, 2, 3, 4]) == plain.decode([1, 2, 3, 4])


def test_a_class_that_overrides_decoding_keeps_the_transformers_path():
    class Shouting(PreTrainedTokenizerFast):
        def _decode(self, token_ids, skip_special_tokens=False, **kwargs):
            return super()._decode(token_ids, skip_special_tokens, **kwargs).upper()

    tok = _word_piece(cleanup=False)
    tok.__class__ = Shouting
    assert backend_json_if_plain(tok) is None
    assert backend_json_if_plain(object()) is None  # not an HF fast tokenizer at all


def test_the_decoder_needs_neither_torch_nor_transformers(smollm2):
    path = write_backend_json(smollm2)
    try:
        code = (
            "import sys; from sglang.srt.managers import detokenizer_manager; "
            "from sglang.srt.utils.backend_decoder import BackendDecoder; "
            "d = BackendDecoder.from_file(sys.argv[1]); print(d.decode([31, 32, 33])); "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
        )
        out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, check=True)
    finally:
        remove_quietly(path)
    assert out.stdout.splitlines() == [smollm2.decode([31, 32, 33]), "[]"]
    assert not os.path.exists(path)
    assert write_backend_json(_word_piece(cleanup=True)) is None  # no file when the fast path does not apply
