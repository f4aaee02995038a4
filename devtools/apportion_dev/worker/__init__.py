"""The demo worker (`apportion demo-worker`), its traffic generator and load burners."""
