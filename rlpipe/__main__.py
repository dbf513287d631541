# First thing: a stop signal from here on is recorded, never a KeyboardInterrupt inside an
# import (rlpipe.supervisor.stopping).
from rlpipe.supervisor.stopping import exit_now, record_stop_signals

record_stop_signals()

from rlpipe.app import main  # noqa: E402

try:
    main()
except SystemExit as exc:
    exit_now(exc.code)
exit_now(0)
