// Command libcni-driver plays the container runtime for Plexus's tests: it hands a network configuration to the
// reference runtime library (libcni, as containerd, CRI-O and kubelet use it) and reports what libcni returned.
//
//	libcni-driver add|check|del|validate --conflist FILE [--netns PATH] [--container-id ID] [--ifname IF]
//	    [--bin-dirs a:b] [--cache-dir D] [--args 'K=V;K2=V2'] [--capability-args JSON]
//
// add prints the result JSON on stdout; validate prints the capability list. A failure exits 1 with the error on
// stderr: a CNI error object as one JSON line when a plugin returned one (so tests can assert its code), else text.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

type options struct {
	command        string
	conflist       string
	netns          string
	containerID    string
	ifname         string
	binDirs        []string
	cacheDir       string
	args           [][2]string
	capabilityArgs map[string]interface{}
}

func parseArgs(argv []string) (*options, error) {
	if len(argv) < 1 {
		return nil, errors.New("missing command: add, check, del or validate")
	}
	opts := &options{command: argv[0]}
	switch opts.command {
	case "add", "check", "del", "validate":
	default:
		return nil, fmt.Errorf("unknown command %q: want add, check, del or validate", opts.command)
	}

	fs := flag.NewFlagSet("libcni-driver", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&opts.conflist, "conflist", "", "network configuration list (or single .conf) file")
	fs.StringVar(&opts.netns, "netns", "", "path of the container's network namespace")
	fs.StringVar(&opts.containerID, "container-id", "", "container id")
	fs.StringVar(&opts.ifname, "ifname", "eth0", "interface name inside the container")
	binDirs := fs.String("bin-dirs", "/usr/lib/cni", "colon-separated plugin directories")
	fs.StringVar(&opts.cacheDir, "cache-dir", "", "libcni cache directory")
	cniArgs := fs.String("args", "", "CNI_ARGS as 'K=V;K2=V2'")
	capArgs := fs.String("capability-args", "", "capability arguments as a JSON object")
	if err := fs.Parse(argv[1:]); err != nil {
		return nil, err
	}
	if fs.NArg() != 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if opts.conflist == "" {
		return nil, errors.New("--conflist is required")
	}
	if opts.command != "validate" {
		if opts.containerID == "" {
			return nil, errors.New("--container-id is required")
		}
		if opts.cacheDir == "" {
			// libcni would fall back to the machine-wide /var/lib/cni, which tests must never share.
			return nil, errors.New("--cache-dir is required")
		}
	}

	for _, d := range strings.Split(*binDirs, ":") {
		if d != "" {
			opts.binDirs = append(opts.binDirs, d)
		}
	}
	if len(opts.binDirs) == 0 {
		return nil, errors.New("--bin-dirs names no directory")
	}

	for _, kv := range strings.Split(*cniArgs, ";") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--args element %q is not K=V", kv)
		}
		opts.args = append(opts.args, [2]string{k, v})
	}

	if *capArgs != "" {
		if err := json.Unmarshal([]byte(*capArgs), &opts.capabilityArgs); err != nil {
			return nil, fmt.Errorf("--capability-args is not a JSON object: %w", err)
		}
	}
	return opts, nil
}

// loadList accepts both a conflist and a single-plugin conf, as runtimes do.
func loadList(path string) (*libcni.NetworkConfigList, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(raw, &probe); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if _, isList := probe["plugins"]; isList {
		return libcni.ConfListFromBytes(raw)
	}
	conf, err := libcni.ConfFromBytes(raw)
	if err != nil {
		return nil, err
	}
	return libcni.ConfListFromConf(conf)
}

func run(opts *options) error {
	list, err := loadList(opts.conflist)
	if err != nil {
		return err
	}
	cni := libcni.NewCNIConfigWithCacheDir(opts.binDirs, opts.cacheDir, nil)
	ctx := context.Background()

	if opts.command == "validate" {
		caps, err := cni.ValidateNetworkList(ctx, list)
		if err != nil {
			return err
		}
		sort.Strings(caps)
		return json.NewEncoder(os.Stdout).Encode(caps)
	}

	netns := opts.netns
	if netns != "" && !filepath.IsAbs(netns) {
		netns = filepath.Join("/run/netns", netns)
	}
	rt := &libcni.RuntimeConf{
		ContainerID:    opts.containerID,
		NetNS:          netns,
		IfName:         opts.ifname,
		Args:           opts.args,
		CapabilityArgs: opts.capabilityArgs,
		CacheDir:       opts.cacheDir,
	}

	switch opts.command {
	case "add":
		result, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			return err
		}
		return result.PrintTo(os.Stdout)
	case "check":
		return cni.CheckNetworkList(ctx, list, rt)
	default:
		return cni.DelNetworkList(ctx, list, rt)
	}
}

func main() {
	opts, err := parseArgs(os.Args[1:])
	if err == nil {
		err = run(opts)
	}
	if err == nil {
		return
	}
	var cniErr *types.Error
	if errors.As(err, &cniErr) {
		line, _ := json.Marshal(cniErr)
		fmt.Fprintln(os.Stderr, string(line))
	} else {
		fmt.Fprintln(os.Stderr, err.Error())
	}
	os.Exit(1)
}
