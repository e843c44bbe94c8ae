"""The ingest package's public names are exactly its sorted ``__all__``."""

import ingest


def test_all_is_sorted_and_importable():
    assert sorted(ingest.__all__) == ingest.__all__
    assert all(hasattr(ingest, name) for name in ingest.__all__)
