"""`controlplane.domain.outputs`: the stored-samples document of a task, old rows included."""

from __future__ import annotations

import pytest

from controlplane.bootstrap import Settings
from controlplane.domain.outputs import output_document, stored_samples

FIRST = {"uri": "file:///o/output.mp4", "key": "o/output.mp4", "size_bytes": 10, "sample_index": 0}
SECOND = {
    "uri": "file:///o/output-1.mp4",
    "key": "o/output-1.mp4",
    "size_bytes": 20,
    "sample_index": 1,
}


def test_the_document_keeps_the_first_sample_on_top_and_every_sample_in_order() -> None:
    """The first sample's fields stay at the top level (old readers), samples lists all by index."""
    document = output_document([SECOND, FIRST])
    assert {k: v for k, v in document.items() if k != "samples"} == FIRST
    assert document["samples"] == [FIRST, SECOND]
    assert stored_samples(document) == [FIRST, SECOND]


def test_a_row_written_before_samples_reads_as_its_one_sample() -> None:
    """An output_asset without samples (older rows) is one sample, index 0; none is no sample."""
    old = {"uri": "s3://b/k.mp4", "key": "k.mp4", "size_bytes": 5}
    assert stored_samples(old) == [{**old, "sample_index": 0}]
    assert stored_samples(None) == []
    assert stored_samples({}) == []
    with pytest.raises(ValueError, match="at least one"):
        output_document([])


def test_the_url_lifetime_setting_has_a_default_and_bounds() -> None:
    """VIDROUTE_OUTPUT_URL_TTL_S defaults to 3600; 1..7 days is taken; anything else fails."""
    assert Settings.from_env({}).output_url_ttl_s == 3600
    assert Settings.from_env({"VIDROUTE_OUTPUT_URL_TTL_S": "604800"}).output_url_ttl_s == 604800
    for bad in ("0", "604801", "1h", "-5"):
        with pytest.raises(ValueError, match="VIDROUTE_OUTPUT_URL_TTL_S"):
            Settings.from_env({"VIDROUTE_OUTPUT_URL_TTL_S": bad})
