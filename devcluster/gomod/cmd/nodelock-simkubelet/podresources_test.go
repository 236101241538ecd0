package main

import (
	"io"
	"sort"
	"strings"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
)

func TestContainerDevicesOneEntryPerDeviceAndNUMANode(t *testing.T) {
	devs := devicemanager.ResourceDeviceInstances{
		"nvidia.com/gpu": {
			"GPU-a": &pluginapi.Device{ID: "GPU-a", Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 1}}}},
			"GPU-b": &pluginapi.Device{ID: "GPU-b"},
		},
	}
	var got []string
	for _, d := range containerDevices(devs) {
		if d.ResourceName != "nvidia.com/gpu" || len(d.DeviceIds) != 1 {
			t.Fatalf("unexpected entry %v", d)
		}
		numa := "-"
		if d.Topology != nil {
			numa = ""
			for _, n := range d.Topology.Nodes {
				numa += string(rune('0' + n.ID))
			}
		}
		got = append(got, d.DeviceIds[0]+"@"+numa)
	}
	sort.Strings(got)
	if strings.Join(got, " ") != "GPU-a@1 GPU-b@-" {
		t.Fatalf("containerDevices = %v", got)
	}
	if out := containerDevices(nil); len(out) != 0 {
		t.Fatalf("no devices gave %v", out)
	}
}

func TestParseFlagsPodResourcesSocket(t *testing.T) {
	cfg, err := parseFlags([]string{"--kubeconfig=/k", "--node-name=n", "--pod-resources-socket=/run/pr/kubelet.sock"}, io.Discard)
	if err != nil || cfg.podResourcesSocket != "/run/pr/kubelet.sock" {
		t.Fatalf("parseFlags: %v %+v", err, cfg)
	}
	long := "/" + strings.Repeat("x", maxSocketPath)
	if _, err := parseFlags([]string{"--kubeconfig=/k", "--node-name=n", "--pod-resources-socket=" + long}, io.Discard); err == nil {
		t.Fatal("a socket path longer than sun_path was accepted")
	}
}
