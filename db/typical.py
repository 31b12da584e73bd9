"""Which measurement of a config is its typical one, flagged `typical` so that the best query stays one seek: the
upper median of the config's ok measurements of one template version by median time, the earlier row on a tie (as
`workers.typical` takes it: the slower of two, the middle of three); every ok one of an unversioned record. On a
shared host one measurement can come out fast by luck, and the fastest of a search's hundreds is the luckiest; a
tuning job measures its finalists again, and their typical measurements, not their luckiest, are what the best
query ranks. The flags of a config are set again whenever a measurement of it is stored (`OF_CONFIG`), those of a
workload on a target after a bulk insert (`OF_PAIR`)."""
from __future__ import annotations

from sqlalchemy import text

# the typical measurement of each config (and template version) in `scope`, and every unversioned one (an imported
# AutoTVM log's, whose config index may mean other knobs in each: each counts alone, as AutoTVM's pick_best has
# it); window functions, which SQLite has had since 3.25 and PostgreSQL since 8.4
TYPICAL_IDS = """SELECT id FROM (
    SELECT id, template_version,
           ROW_NUMBER() OVER (PARTITION BY workload_id, target_id, config_index, template_version
                              ORDER BY median_seconds, id) AS place,
           COUNT(*) OVER (PARTITION BY workload_id, target_id, config_index, template_version) AS runs
    FROM measurements WHERE {scope} AND outcome = 'ok'
) AS ranked WHERE place = runs / 2 + 1 OR template_version IS NULL"""


def flagging(scope: str) -> str:
    """The UPDATE that sets `typical` on the typical measurements in `scope` (an SQL condition) and clears it on
    the rest there (every other measurement, failed ones too)."""
    return f"UPDATE measurements SET typical = (id IN ({TYPICAL_IDS.format(scope=scope)})) WHERE {scope}"


OF_PAIR = text(flagging("workload_id = :workload_id AND target_id = :target_id"))
OF_CONFIG = text(flagging("workload_id = :workload_id AND target_id = :target_id AND config_index = :config_index"))
