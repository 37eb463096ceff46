"""Switch and NIC telemetry parsers: every format becomes raw samples in the `counters` table.

One module per format (Prometheus text and query_range JSON, gnmic json/event, `perfquery`,
UFM telemetry JSON, sysfs counter dumps) plus `ibnetdiscover` and link maps, which fill the
`topology_nodes` / `topology_links` tables. Names and units are made canonical at parse time
(`families.py`); rates are derived later, in one place (`tracekit.telemetry`).
"""
