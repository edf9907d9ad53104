"""``tokenspeed replay-kv-events`` and the pieces it is made of.

wire (decode the vLLM-compatible batches), recording (the ``--record`` file format), subscriber
(ZMQ SUB + replay), index (rebuild + validate), simulate (KV-aware router hit rate), cli (the
command). The command is imported lazily by the CLI frame: ``from tokenspeed_cli.kv_events.cli
import replay_kv_events``.
"""
