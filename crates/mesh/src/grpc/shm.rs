//! The shared-memory extensions' gRPC methods, as plain functions over the server's registry.
use crate::error::Result;
use crate::proto;
use crate::shm::SharedMemory;

pub fn system_status(shm: &SharedMemory, name: &str) -> Result<proto::SystemSharedMemoryStatusResponse> {
    use proto::system_shared_memory_status_response::RegionStatus;
    let regions = shm
        .system_status(name)?
        .into_iter()
        .map(|r| {
            let status = RegionStatus {
                name: r.name.clone(),
                key: r.key,
                offset: r.offset,
                byte_size: r.byte_size,
            };
            (r.name, status)
        })
        .collect();
    Ok(proto::SystemSharedMemoryStatusResponse { regions })
}

pub fn cuda_status(shm: &SharedMemory, name: &str) -> Result<proto::CudaSharedMemoryStatusResponse> {
    use proto::cuda_shared_memory_status_response::RegionStatus;
    let regions = shm
        .cuda_status(name)?
        .into_iter()
        .map(|r| {
            let status = RegionStatus {
                name: r.name.clone(),
                device_id: r.device_id as u64,
                byte_size: r.byte_size,
            };
            (r.name, status)
        })
        .collect();
    Ok(proto::CudaSharedMemoryStatusResponse { regions })
}

pub fn system_register(shm: &SharedMemory, r: proto::SystemSharedMemoryRegisterRequest) -> Result<()> {
    shm.register_system(&r.name, &r.key, r.offset, r.byte_size)
}

pub fn cuda_register(shm: &SharedMemory, r: proto::CudaSharedMemoryRegisterRequest) -> Result<()> {
    shm.register_cuda(&r.name, &r.raw_handle, r.device_id, r.byte_size)
}
