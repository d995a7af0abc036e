"""Instance processes: each owns one backend and runs batches from shared memory.

``process.InstanceProcess`` is the front's handle on one worker; ``worker`` is the process
main; ``messages`` the frames between them; ``arena`` the shared-memory slots tensors cross.
"""
