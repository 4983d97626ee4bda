"""The parts ``backend="process"`` (``backends/process.py``) is assembled from.

``link.py``: one worker process and its pipes; ``reactor.py``: the one table
of descriptors the parent waits on, from the loop or a parked ``poll``;
``shared.py``: the step buffer; ``lean.py``: a blocking caller's wait for a
lean step's replies.
"""
