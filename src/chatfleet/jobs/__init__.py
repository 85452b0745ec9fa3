"""Whole jobs the CLI runs, each built from the shells below it:

* :mod:`~chatfleet.jobs.plan`: ``chatfleet plan``'s answer (the twin's sweeps or a sweep file,
  then users per card, caps, fleet, launch commands and the gateway's config), with
  :mod:`~chatfleet.jobs.plan_tasks` (its twin sweeps and fleet runs, as workers get them) and
  :mod:`~chatfleet.jobs.workers` (the spawned worker pool that runs them at once);
* :mod:`~chatfleet.jobs.demo`: ``chatfleet demo`` (the plan, then the answer proved live);
* :mod:`~chatfleet.jobs.parity`: the twin against the simserver, and the twin's fleet against a
  live gateway in front of simserver replicas.
"""
