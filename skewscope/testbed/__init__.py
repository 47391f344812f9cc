"""Test fabrics on one machine: a veth pair (netns), traffic and measurements across it (traffic),
and the N-node RoCE fabric with a switch and a DPU observer (fabric) for the demo and integration tests."""
