"""A step's sampled tokens mapped onto one int object per token id."""
from parashift.engine.token_ints import TokenInts


def fresh(values):
    """Int objects of their own (as a tensor's tolist() makes them)."""
    return [int(str(v)) for v in values]


def test_tokens_become_the_shared_object_of_their_id():
    ints = TokenInts(1000)
    first, second = ints.canonical(fresh([300, 999, 0, 300])), ints.canonical(fresh([999, 300]))
    assert first == [300, 999, 0, 300] and second == [999, 300]
    assert first[0] is first[3] is second[1] and first[1] is second[0]
    assert fresh([300])[0] is not fresh([300])[0]  # (what it saves)


def test_tokens_out_of_the_vocabulary_are_left_as_they_are():
    ints = TokenInts(1000)
    for tokens in ([5, 1000], [-1, 5], []):
        assert ints.canonical(tokens) is tokens
