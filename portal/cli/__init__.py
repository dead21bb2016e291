"""gpu-portal: the GPU Portal's command-line client.

Standard library only and no Django: `pip install ./portal/cli` installs it alone on a login node
(as the package `gpu_portal_cli`), and the portal's own package installs it as `portal.cli`. Every
import inside it is relative so both names work.
"""

__version__ = "0.1.0"
