package main

import (
	"encoding/json"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
)

const (
	// allocatedAnnotation records, per container that got devices, what kubelet's device side
	// produced for it: the device manager's device IDs and the runtime options it would hand
	// to the container runtime.
	allocatedAnnotation = "sim.nodelock.io/allocated"
	// runSecondsAnnotation makes a Running pod succeed after that many seconds.
	runSecondsAnnotation = "sim.nodelock.io/run-seconds"
	// rejectAfterAllocateAnnotation makes admission reject the pod with this reason after the
	// device manager's Allocate was answered for every container, as kubelet's later admit
	// handlers can (predicate: resources, node affinity, taints; AppArmor; node shutdown; they
	// run after the resource allocation handler, kubelet.go NewMainKubelet).
	rejectAfterAllocateAnnotation = "sim.nodelock.io/reject-after-allocate"
)

// containerRecord is one container's entry in allocatedAnnotation.
type containerRecord struct {
	// DeviceIDs are the IDs of --resource-name the device manager allocated, sorted.
	DeviceIDs []string `json:"deviceIDs"`
	// Envs are the environment variables from GetDeviceRunContainerOptions.
	Envs map[string]string `json:"envs"`
	// Devices are the host device nodes (hostPath -> containerPath) to map, if any.
	Devices []deviceRecord `json:"devices,omitempty"`
	// Mounts are the bind mounts, if any.
	Mounts []mountRecord `json:"mounts,omitempty"`
	// Annotations are the container annotations, if any.
	Annotations map[string]string `json:"annotations,omitempty"`
	// CDIDevices are the fully qualified CDI device names, if any.
	CDIDevices []string `json:"cdiDevices,omitempty"`
	// OtherResources holds device IDs of other device plugin resources, sorted, if any.
	OtherResources map[string][]string `json:"otherResources,omitempty"`
}

type deviceRecord struct {
	HostPath      string `json:"hostPath"`
	ContainerPath string `json:"containerPath"`
	Permissions   string `json:"permissions,omitempty"`
}

type mountRecord struct {
	HostPath      string `json:"hostPath"`
	ContainerPath string `json:"containerPath"`
	ReadOnly      bool   `json:"readOnly,omitempty"`
}

// buildContainerRecord turns the device manager's view of one container into its record.
// It reports false when the container got no devices of any device plugin resource.
func buildContainerRecord(resourceName string, devs devicemanager.ResourceDeviceInstances, opts *devicemanager.DeviceRunContainerOptions) (containerRecord, bool) {
	rec := containerRecord{DeviceIDs: []string{}, Envs: map[string]string{}}
	got := false
	for resource, instances := range devs {
		if len(instances) == 0 {
			continue
		}
		got = true
		ids := sortedKeys(instances)
		if resource == resourceName {
			rec.DeviceIDs = ids
			continue
		}
		if rec.OtherResources == nil {
			rec.OtherResources = map[string][]string{}
		}
		rec.OtherResources[resource] = ids
	}
	if !got {
		return rec, false
	}
	if opts != nil {
		for _, e := range opts.Envs {
			rec.Envs[e.Name] = e.Value
		}
		for _, d := range opts.Devices {
			rec.Devices = append(rec.Devices, deviceRecord{HostPath: d.PathOnHost, ContainerPath: d.PathInContainer, Permissions: d.Permissions})
		}
		for _, m := range opts.Mounts {
			rec.Mounts = append(rec.Mounts, mountRecord{HostPath: m.HostPath, ContainerPath: m.ContainerPath, ReadOnly: m.ReadOnly})
		}
		for _, a := range opts.Annotations {
			if rec.Annotations == nil {
				rec.Annotations = map[string]string{}
			}
			rec.Annotations[a.Name] = a.Value
		}
		for _, c := range opts.CDIDevices {
			rec.CDIDevices = append(rec.CDIDevices, c.Name)
		}
		sort.Strings(rec.CDIDevices)
	}
	return rec, true
}

// encodeAllocated renders allocatedAnnotation's value (keys sorted by encoding/json).
func encodeAllocated(records map[string]containerRecord) (string, error) {
	b, err := json.Marshal(records)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// podContainers returns init containers then containers, in spec order (kubelet's admission order).
func podContainers(pod *v1.Pod) []v1.Container {
	out := make([]v1.Container, 0, len(pod.Spec.InitContainers)+len(pod.Spec.Containers))
	out = append(out, pod.Spec.InitContainers...)
	return append(out, pod.Spec.Containers...)
}

// runDuration reads runSecondsAnnotation. ok is false when the annotation is absent; err is set
// when it is present but not a non-negative number of seconds.
func runDuration(pod *v1.Pod) (d time.Duration, ok bool, err error) {
	raw, ok := pod.Annotations[runSecondsAnnotation]
	if !ok {
		return 0, false, nil
	}
	secs, err := strconv.ParseFloat(strings.TrimSpace(raw), 64)
	if err != nil || secs < 0 || secs > 1e9 {
		return 0, false, &badAnnotationError{key: runSecondsAnnotation, value: raw}
	}
	return time.Duration(secs * float64(time.Second)), true, nil
}

type badAnnotationError struct{ key, value string }

func (e *badAnnotationError) Error() string {
	return "annotation " + e.key + "=" + strconv.Quote(e.value) + " is not a non-negative number of seconds"
}
