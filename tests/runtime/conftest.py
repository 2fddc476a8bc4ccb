import pytest

from tests.runtime.fakes import tokenizer_path


@pytest.fixture(scope="session")
def tok():
    """The test tokenizer (tiny model's SmolLM2 tokenizer), loaded once."""
    from rao_core.runtime import load_tokenizer

    return load_tokenizer(tokenizer_path())
