"""Soak: a real server under mixed load, faults and hostile input, for a while.

    python -m tools.soak [--duration 60] [--concurrency 8] [--fault-every 3]

Two servers. The main one holds eight models. ``adder`` answers x + 1 and refuses an item
starting with POISON as bad input (``reposerve.InvalidInput``); ``hangs`` hangs for good on
an item starting with 13, and its execution timeout (1 s) kills and replaces the instance;
``stuck`` hangs with no timeout and is used only at the end; ``counter`` is decoupled and
streams 0..COUNT-1; ``chain`` is an ensemble of one ``adder`` step; ``recurse`` calls itself
without end; ``sink`` takes bytes of any length and answers the first; ``tally`` keeps a
sequence's running sum as implicit state (``sequences.py``). A second server loads models on
demand within a memory budget that holds three of its four, and an ensemble of two of them
(``churn.py``).

Clients send good requests (each checked against its exact answer), poisoned ones (a 400 for
that request alone, while the rest of its batch is served), hanging ones (a 500 naming the
timeout), malformed ones (a 4xx), requests through ``chain``, requests to ``recurse`` (a 500
at the depth limit, at once) and streams over generate_stream (every response in order, or a
fault's error as the last event; some clients leave after two responses, which cancels the
rest). One client sends large gRPC messages (8-32 MiB) to ``sink`` and to a model that does
not exist. Sequence clients run whole sequences, each sum checked, while another starts
sequences and leaves before the answer (a START withdrawn from the backlog, or a sequence
the idle timeout releases). A region client registers client shared-memory regions, has
``adder`` read and write through them and unregisters them, now and then with a lying
registration (a 400). On the second server, clients request its models and the ensemble at
random (each load evicts another), and one asks for models that do not exist under new 8 KB
names (a 404 each).

Meanwhile a fault loop in turn SIGKILLs an instance, reloads ``adder`` from disk, unloads
and loads ``hangs`` again, tries to make ``chain`` call itself (a load override that must be
refused as a cycle) and sends a malformed load override (a 400 naming the field). Then the
clients stop: every request must have had its answer and the pending gauge must read 0.
Last, requests are left queued behind a hung ``stuck`` and the server gets SIGTERM: each
must get a JSON error, and the server must exit 0 within its --exit-timeout-secs.

It passes when nothing was lost (every request has its result, or an error its fault
explains), pending is 0, each front's memory and open descriptors are where they were after
warm-up once the load has stopped, and no instance outlived the server. Exit status 0 on a
pass, 1 otherwise.
"""
