// Command dra-driver is the DRA driver of the suite's network devices, run on the test node as a DRA driver's
// kubelet plugin runs: it publishes the node's ResourceSlice (devices with the k8s.cni.cncf.io/deviceID and
// k8s.cni.cncf.io/resourceName attributes, as network device drivers publish them for Multus and Plexus),
// registers with the kubelet on its plugin registration socket and answers NodePrepareResources and
// NodeUnprepareResources for the claims allocated from those devices. There is no hardware behind the devices:
// preparing a claim records it and hands the kubelet no CDI device. With --network-data-request, it also writes
// the claim's status.devices networkData of that request's devices when it prepares them, as drivers that
// configure the interface themselves do (dranet, the SR-IOV DRA driver).
//
// It is built on k8s.io/dynamic-resource-allocation's kubeletplugin helper, the library DRA drivers use.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

type driver struct {
	name   string
	client kubernetes.Interface
	// The request whose devices get network data written by the driver ("" for none).
	networkDataRequest string
	// Each prepare and unprepare call, one line each ("prepare NS/NAME UID request=pool/device ..."), for the test.
	record *os.File
	mu     sync.Mutex
}

func (d *driver) note(line string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fmt.Fprintln(d.record, line)
	_ = d.record.Sync()
}

func (d *driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	result := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		var prepared kubeletplugin.PrepareResult
		line := []string{"prepare", claim.Namespace + "/" + claim.Name, string(claim.UID)}
		if claim.Status.Allocation == nil {
			prepared.Err = fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
		} else {
			for _, r := range claim.Status.Allocation.Devices.Results {
				if r.Driver != d.name {
					continue
				}
				prepared.Devices = append(prepared.Devices, kubeletplugin.Device{
					Requests:   []string{r.Request},
					PoolName:   r.Pool,
					DeviceName: r.Device,
					ShareID:    r.ShareID,
				})
				line = append(line, fmt.Sprintf("%s=%s/%s", r.Request, r.Pool, r.Device))
			}
			if err := d.writeNetworkData(ctx, claim); err != nil {
				prepared.Err = err
			}
		}
		d.note(strings.Join(line, " "))
		result[claim.UID] = prepared
	}
	return result, nil
}

// writeNetworkData gives each device of the claim's --network-data-request an entry of status.devices with the
// driver's own networkData (interface "drv-<device>", address 192.0.2.<n>/24), unless the claim has it already.
func (d *driver) writeNetworkData(ctx context.Context, claim *resourceapi.ResourceClaim) error {
	if d.networkDataRequest == "" {
		return nil
	}
	claims := d.client.ResourceV1().ResourceClaims(claim.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		current, err := claims.Get(ctx, claim.Name, metav1.GetOptions{})
		if err != nil || current.Status.Allocation == nil {
			return err
		}
		changed := false
		for i, r := range current.Status.Allocation.Devices.Results {
			if r.Driver != d.name || r.Request != d.networkDataRequest || hasEntry(current, r) {
				continue
			}
			current.Status.Devices = append(current.Status.Devices, resourceapi.AllocatedDeviceStatus{
				Driver: r.Driver, Pool: r.Pool, Device: r.Device,
				NetworkData: &resourceapi.NetworkDeviceData{
					InterfaceName: "drv-" + r.Device,
					IPs:           []string{fmt.Sprintf("192.0.2.%d/24", 10+i)},
				},
			})
			changed = true
		}
		if !changed {
			return nil
		}
		_, err = claims.UpdateStatus(ctx, current, metav1.UpdateOptions{})
		if err == nil {
			d.note(fmt.Sprintf("networkData %s/%s", claim.Namespace, claim.Name))
		}
		return err
	})
}

func hasEntry(claim *resourceapi.ResourceClaim, r resourceapi.DeviceRequestAllocationResult) bool {
	for _, e := range claim.Status.Devices {
		if e.Driver == r.Driver && e.Pool == r.Pool && e.Device == r.Device {
			return true
		}
	}
	return false
}

func (d *driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	result := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		d.note(strings.Join([]string{"unprepare", claim.Namespace + "/" + claim.Name, string(claim.UID)}, " "))
		result[claim.UID] = nil
	}
	return result, nil
}

func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		os.Exit(1)
	}
}

func (d *driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func main() {
	var (
		kubeconfig   = flag.String("kubeconfig", "", "the driver's kubeconfig")
		nodeName     = flag.String("node-name", "", "the node this plugin serves")
		driverName   = flag.String("driver-name", "", "the DRA driver's name")
		resourceName = flag.String("resource-name", "", "the k8s.cni.cncf.io/resourceName attribute of every device")
		devices      = flag.String("devices", "", "comma-separated NAME=PCI-ADDRESS: the devices and their k8s.cni.cncf.io/deviceID")
		registrarDir = flag.String("registrar-dir", "", "the kubelet's plugin registration directory (<root-dir>/plugins_registry)")
		pluginDir    = flag.String("plugin-dir", "", "the directory of this plugin's socket (<root-dir>/plugins/<driver>)")
		record       = flag.String("record", "", "the file each prepare and unprepare call is recorded in")
		networkData  = flag.String("network-data-request", "", "the request whose devices get the driver's own status.devices networkData when prepared")
		shared       = flag.String("shared-devices", "", "comma-separated NAME=PCI-ADDRESS: devices published with allowMultipleAllocations (each allocation a share with its shareID)")
	)
	klog.InitFlags(nil)
	flag.Parse()
	if *kubeconfig == "" || *nodeName == "" || *driverName == "" || *registrarDir == "" || *pluginDir == "" || *record == "" {
		fmt.Fprintln(os.Stderr, "dra-driver: --kubeconfig, --node-name, --driver-name, --registrar-dir, --plugin-dir and --record are required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, *kubeconfig, *nodeName, *driverName, *resourceName, *devices, *registrarDir, *pluginDir, *record, *networkData, *shared); err != nil {
		fmt.Fprintf(os.Stderr, "dra-driver: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, kubeconfig, nodeName, driverName, resourceName, deviceList, registrarDir, pluginDir, recordPath, networkDataRequest, sharedList string) error {
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	config.Timeout = 0
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	published, err := parseDevices(deviceList, resourceName, false)
	if err != nil {
		return fmt.Errorf("--devices: %w", err)
	}
	shared, err := parseDevices(sharedList, resourceName, true)
	if err != nil {
		return fmt.Errorf("--shared-devices: %w", err)
	}
	published = append(published, shared...)
	if err := os.MkdirAll(pluginDir, 0o750); err != nil {
		return err
	}
	recordFile, err := os.OpenFile(recordPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer recordFile.Close()
	node, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("node %s: %w", nodeName, err)
	}
	d := &driver{name: driverName, client: client, networkDataRequest: networkDataRequest, record: recordFile}
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(nodeName),
		kubeletplugin.NodeUID(node.UID),
		kubeletplugin.DriverName(driverName),
		kubeletplugin.RegistrarDirectoryPath(registrarDir),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		return err
	}
	defer helper.Stop()
	resources := resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{
			nodeName: {Slices: []resourceslice.Slice{{Devices: published}}},
		},
	}
	if err := helper.PublishResources(ctx, resources); err != nil {
		return fmt.Errorf("publish the ResourceSlice: %w", err)
	}
	fmt.Fprintf(os.Stderr, "dra-driver: %s serving %d devices on %s\n", driverName, len(published), nodeName)
	// Said once the kubelet has taken the plugin (its registration call answered), for whoever waits on it.
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	for said := false; ; {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			if status := helper.RegistrationStatus(); !said && status != nil && status.PluginRegistered {
				fmt.Fprintln(os.Stderr, "dra-driver: registered with the kubelet")
				said = true
			}
		}
	}
}

// parseDevices reads NAME=PCI-ADDRESS,... into devices with both network attributes; `multiple` publishes them with
// allowMultipleAllocations.
func parseDevices(list, resourceName string, multiple bool) ([]resourceapi.Device, error) {
	var out []resourceapi.Device
	for _, item := range strings.Split(list, ",") {
		if item == "" {
			continue
		}
		name, pci, ok := strings.Cut(item, "=")
		if !ok {
			return nil, fmt.Errorf("%q is not NAME=PCI-ADDRESS", item)
		}
		d := resourceapi.Device{
			Name: name,
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"k8s.cni.cncf.io/deviceID":     {StringValue: ptr.To(pci)},
				"k8s.cni.cncf.io/resourceName": {StringValue: ptr.To(resourceName)},
			},
		}
		if multiple {
			d.AllowMultipleAllocations = ptr.To(true)
		}
		out = append(out, d)
	}
	return out, nil
}
