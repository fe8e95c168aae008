package config

import (
	"fmt"
	"net"
	"strconv"
)

// CheckListenAddr reports, without listening or resolving a host, whether addr is an address
// a TCP listener can take as written: host:port (the host may be empty, the port empty or 0
// for any free port, a number up to 65535 or a service name). The error names the setting
// (name, an environment variable) and what it wants, on one line.
func CheckListenAddr(name, addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err == nil && port != "" {
		if n, aerr := strconv.Atoi(port); aerr == nil {
			if n < 0 || n > 65535 {
				err = fmt.Errorf("port %d out of range", n)
			}
		} else if _, lerr := net.LookupPort("tcp", port); lerr != nil {
			err = fmt.Errorf("unknown port %q", port)
		}
	}
	if err != nil {
		return fmt.Errorf("%s=%q: want host:port, e.g. 127.0.0.1:8765 (%v)", name, addr, err)
	}
	return nil
}
