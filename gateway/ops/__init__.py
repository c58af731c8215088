"""Operations around the daemon: metrics, logging, systemd notify, `doctor`, `service install`."""
