"""What runs inside a local sandbox: its init (PID 1), the command runner, file operations, the root
filesystem set-up, the pre-positioned stubs, the egress forwarder, raw syscalls and the wire protocol
the host speaks to the init.

The folder follows the process the code runs in (as gVisor's ``runsc/boot`` does): everything here
runs in the sandbox's namespaces, in an interpreter whose start-up time and memory count against every
idle sandbox. So these modules import only the standard library and each other
(``tests/local/test_guest_imports.py`` holds them to it); the host side lives one level up.
"""
