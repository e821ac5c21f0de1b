"""Active pair tests (issue #35): bandwidth and latency to another agent, bounded in time and bytes."""
