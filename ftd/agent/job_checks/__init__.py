"""A job's communication path checked at its start (issue #36): NCCL's transport, peermem, limits, ACS."""
