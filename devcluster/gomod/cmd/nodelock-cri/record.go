package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	kubeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// containerRecord is one line of the record file: one CreateContainer call, as kubelet made it.
type containerRecord struct {
	Time        string            `json:"time"`
	Namespace   string            `json:"namespace"`
	Pod         string            `json:"pod"`
	PodUID      string            `json:"podUID"`
	Container   string            `json:"container"`
	Attempt     uint32            `json:"attempt"`
	Init        bool              `json:"runsToCompletion"`
	Image       string            `json:"image"`
	Envs        map[string]string `json:"envs"`
	Devices     []deviceRecord    `json:"devices"`
	Mounts      []mountRecord     `json:"mounts"`
	CDIDevices  []string          `json:"cdiDevices"`
	Annotations map[string]string `json:"annotations"`
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

// recordOf turns a CreateContainer request into its record.
func recordOf(req *kubeapi.CreateContainerRequest, runsToCompletion bool) containerRecord {
	cfg := req.GetConfig()
	labels := cfg.GetLabels()
	rec := containerRecord{
		Time:        time.Now().UTC().Format(time.RFC3339Nano),
		Namespace:   labels[labelPodNamespace],
		Pod:         labels[labelPodName],
		PodUID:      labels[labelPodUID],
		Container:   labels[labelContainerName],
		Attempt:     cfg.GetMetadata().GetAttempt(),
		Init:        runsToCompletion,
		Image:       cfg.GetImage().GetImage(),
		Envs:        map[string]string{},
		Devices:     []deviceRecord{},
		Mounts:      []mountRecord{},
		CDIDevices:  []string{},
		Annotations: map[string]string{},
	}
	if rec.Container == "" {
		rec.Container = cfg.GetMetadata().GetName()
	}
	for _, kv := range cfg.GetEnvs() {
		rec.Envs[kv.GetKey()] = string(kv.GetValue())
	}
	for _, d := range cfg.GetDevices() {
		rec.Devices = append(rec.Devices, deviceRecord{HostPath: d.GetHostPath(), ContainerPath: d.GetContainerPath(), Permissions: d.GetPermissions()})
	}
	for _, m := range cfg.GetMounts() {
		rec.Mounts = append(rec.Mounts, mountRecord{HostPath: m.GetHostPath(), ContainerPath: m.GetContainerPath(), ReadOnly: m.GetReadonly()})
	}
	for _, c := range cfg.GetCDIDevices() {
		rec.CDIDevices = append(rec.CDIDevices, c.GetName())
	}
	sort.Strings(rec.CDIDevices)
	for k, v := range cfg.GetAnnotations() {
		rec.Annotations[k] = v
	}
	return rec
}

// recorder appends records to a file, one JSON object a line, each written whole before the
// CreateContainer call that produced it returns.
type recorder struct {
	mu sync.Mutex
	f  *os.File
}

func openRecorder(path string) (*recorder, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &recorder{f: f}, nil
}

func (r *recorder) write(rec containerRecord) error {
	line, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encoding: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, err = r.f.Write(append(line, '\n'))
	return err
}

func (r *recorder) close() { _ = r.f.Close() }
