"""A ramp step, measured: the client's figures with their intervals, the SLA verdict, the
server's window and the load generator's health, as frozen values.

Metric definitions follow ``vllm bench serve``:
- TTFT: first content-bearing chunk minus send time.
- ITL: gaps between consecutive content chunks, pooled over all requests.
- TPOT: per request, (E2E - TTFT) / (output tokens - 1), output tokens from ``usage``.
- E2E: last byte minus send time.
- Percentiles: numpy's linear interpolation over the raw samples of the step.
- Goodput: requests per second whose TTFT, TPOT and E2E all meet the SLA limits given for
  them (an ITL limit is held against the request's TPOT, its mean inter-token gap).

Every value here writes itself as the dict ``ramp.json`` has always held (``as_dict``) and
reads itself back from any such dict, old or new (``from_dict``); :mod:`spoc_tui.core.results`
is the file codec around them.
"""

from __future__ import annotations

from spoc_tui.core.ramp.steps.arrivals import ARRIVAL_BIN_S as ARRIVAL_BIN_S
from spoc_tui.core.ramp.steps.arrivals import LOCKSTEP_SYNC as LOCKSTEP_SYNC
from spoc_tui.core.ramp.steps.arrivals import MIN_ARRIVALS as MIN_ARRIVALS
from spoc_tui.core.ramp.steps.arrivals import Arrivals as Arrivals
from spoc_tui.core.ramp.steps.arrivals import Interval3 as Interval3
from spoc_tui.core.ramp.steps.arrivals import arrival_rate as arrival_rate
from spoc_tui.core.ramp.steps.arrivals import arrivals as arrivals
from spoc_tui.core.ramp.steps.client import CLIENT_CPU_PCT as CLIENT_CPU_PCT
from spoc_tui.core.ramp.steps.client import CLIENT_LAG_P99_MS as CLIENT_LAG_P99_MS
from spoc_tui.core.ramp.steps.client import CLIENT_LAG_SHARE as CLIENT_LAG_SHARE
from spoc_tui.core.ramp.steps.client import ClientHealth as ClientHealth
from spoc_tui.core.ramp.steps.client import ProcessHealth as ProcessHealth
from spoc_tui.core.ramp.steps.client import client_health as client_health
from spoc_tui.core.ramp.steps.client import lag_allowed_ms as lag_allowed_ms
from spoc_tui.core.ramp.steps.codec import Json as Json
from spoc_tui.core.ramp.steps.codec import json_float as json_float
from spoc_tui.core.ramp.steps.codec import json_int as json_int
from spoc_tui.core.ramp.steps.codec import json_interval as json_interval
from spoc_tui.core.ramp.steps.figures import STAT_NAMES as STAT_NAMES
from spoc_tui.core.ramp.steps.figures import Figures as Figures
from spoc_tui.core.ramp.steps.figures import Latency as Latency
from spoc_tui.core.ramp.steps.figures import Totals as Totals
from spoc_tui.core.ramp.steps.sample import RequestSample as RequestSample
from spoc_tui.core.ramp.steps.server import QUEUE_MIN_POINTS as QUEUE_MIN_POINTS
from spoc_tui.core.ramp.steps.server import QUEUE_MIN_RISES as QUEUE_MIN_RISES
from spoc_tui.core.ramp.steps.server import QUEUE_MIN_SPAN_S as QUEUE_MIN_SPAN_S
from spoc_tui.core.ramp.steps.server import GpuWindow as GpuWindow
from spoc_tui.core.ramp.steps.server import ServerWindow as ServerWindow
from spoc_tui.core.ramp.steps.server import queue_unbounded as queue_unbounded
from spoc_tui.core.ramp.steps.server import unbounded_of as unbounded_of
from spoc_tui.core.ramp.steps.sessions import Sessions as Sessions
from spoc_tui.core.ramp.steps.sessions import sessions_of as sessions_of
from spoc_tui.core.ramp.steps.shadow import StepShadow as StepShadow
from spoc_tui.core.ramp.steps.summary import BLOCKS as BLOCKS
from spoc_tui.core.ramp.steps.summary import USER_UNITS_MIN as USER_UNITS_MIN
from spoc_tui.core.ramp.steps.summary import EarlyStop as EarlyStop
from spoc_tui.core.ramp.steps.summary import StepSummary as StepSummary
from spoc_tui.core.ramp.steps.summary import badly_broken as badly_broken
from spoc_tui.core.ramp.steps.summary import judge as judge
from spoc_tui.core.ramp.steps.summary import point_value as point_value
from spoc_tui.core.ramp.steps.summary import server_failed as server_failed
from spoc_tui.core.ramp.steps.summary import stats as stats
from spoc_tui.core.ramp.steps.summary import summarize_step as summarize_step
from spoc_tui.core.ramp.steps.summary import time_blocks as time_blocks
from spoc_tui.core.ramp.steps.summary import user_units as user_units
from spoc_tui.core.ramp.steps.summary import went_away as went_away
from spoc_tui.core.ramp.steps.trace import ReplaySent as ReplaySent
from spoc_tui.core.ramp.steps.trace import TraceFidelity as TraceFidelity
from spoc_tui.core.ramp.steps.trace import held_back as held_back
from spoc_tui.core.ramp.steps.trace import three as three
from spoc_tui.core.ramp.steps.trace import trace_fidelity as trace_fidelity
from spoc_tui.core.ramp.steps.verdict import Check as Check
from spoc_tui.core.ramp.steps.verdict import StepVerdict as StepVerdict
