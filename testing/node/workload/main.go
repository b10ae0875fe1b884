// Command workload is the node test's workload image: it listens on TCP ports and answers every
// connection with one line saying where the connection was headed before any redirect (the
// original destination, SO_ORIGINAL_DST), where it landed and where it came from; and it serves
// HTTP 200 on the -http ports (kubelet's probes).
//
//	workload -tcp 15001,15006,8080 -http 8081 -name istio-proxy
//
// With -connect host:port it dials once and exits 0 when the connection was accepted (an init
// container showing that its pod's traffic was captured before its containers started).
package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// SOL_IP / SO_ORIGINAL_DST as netfilter defines them.
const soOriginalDst = 80

func originalDst(c *net.TCPConn) string {
	raw, err := c.SyscallConn()
	if err != nil {
		return "none"
	}
	var addr syscall.RawSockaddrInet4
	var result = "none"
	_ = raw.Control(func(fd uintptr) {
		size := uint32(unsafe.Sizeof(addr))
		_, _, errno := syscall.Syscall6(syscall.SYS_GETSOCKOPT, fd, syscall.SOL_IP, soOriginalDst,
			uintptr(unsafe.Pointer(&addr)), uintptr(unsafe.Pointer(&size)), 0)
		if errno != 0 {
			return
		}
		port := int(addr.Port>>8) | int(addr.Port&0xff)<<8
		result = fmt.Sprintf("%d.%d.%d.%d:%d", addr.Addr[0], addr.Addr[1], addr.Addr[2], addr.Addr[3], port)
	})
	return result
}

func serveTCP(name, port string) {
	l, err := net.Listen("tcp", ":"+port)
	if err != nil {
		fmt.Fprintf(os.Stderr, "listen %s: %v\n", port, err)
		os.Exit(1)
	}
	for {
		c, err := l.Accept()
		if err != nil {
			continue
		}
		tc := c.(*net.TCPConn)
		fmt.Fprintf(c, "name=%s orig=%s local=%s peer=%s\n", name, originalDst(tc), c.LocalAddr(), c.RemoteAddr())
		c.Close()
	}
}

func main() {
	tcp := flag.String("tcp", "", "comma-separated TCP ports answered with the original destination")
	httpPorts := flag.String("http", "", "comma-separated ports serving HTTP 200")
	name := flag.String("name", "workload", "the name each answer starts with")
	connect := flag.String("connect", "", "connect once to this host:port and exit: 0 when the connection was accepted (an init container proving its pod's traffic is captured)")
	flag.Parse()
	if *connect != "" {
		c, err := net.DialTimeout("tcp", *connect, 5*time.Second)
		if err != nil {
			fmt.Fprintf(os.Stderr, "connect %s: %v\n", *connect, err)
			os.Exit(1)
		}
		fmt.Printf("connected to %s from %s\n", *connect, c.LocalAddr())
		c.Close()
		return
	}
	for _, p := range strings.Split(*tcp, ",") {
		if p != "" {
			go serveTCP(*name, p)
		}
	}
	for _, p := range strings.Split(*httpPorts, ",") {
		if p != "" {
			go func(p string) {
				err := http.ListenAndServe(":"+p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					fmt.Fprintf(w, "ok %s\n", *name)
				}))
				fmt.Fprintf(os.Stderr, "http %s: %v\n", p, err)
				os.Exit(1)
			}(p)
		}
	}
	fmt.Printf("workload %s: tcp %s http %s\n", *name, *tcp, *httpPorts)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	<-signals
}
