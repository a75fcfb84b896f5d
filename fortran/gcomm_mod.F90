! fortran/gcomm_mod.F90 - gcomm for Fortran: `use gcomm` gives the whole API of gcomm.h.
!
! The functions keep their C names and argument order and return an integer(c_int) result
! (gcommSuccess, ...). Handles and buffers are type(c_ptr):
!   - a communicator is a type(c_ptr) (c_null_ptr until gcommCommInitMPI sets it);
!   - a buffer is c_loc(array) for a host array (the array needs the target attribute), or a GPU
!     address: c_devloc(array) in CUDA Fortran or OpenACC (under !$acc host_data use_device), or
!     a type(c_ptr) from cudaMalloc;
!   - a stream is a type(c_ptr): c_null_ptr on a host communicator, acc_get_cuda_stream(q) in
!     OpenACC, transfer(stream, c_null_ptr) for a CUDA Fortran integer(cuda_stream_kind);
!   - a config is c_null_ptr or c_loc(cfg), cfg = gcommConfigInitializer() then fields set.
! Counts are integer(c_size_t): pass int(n, c_size_t). Error texts come back as Fortran strings
! (gcommGetErrorString, gcommGetLastError).
!
! gcommCommInitMPI takes a Fortran MPI communicator, an `integer` (use mpi) or a type(MPI_Comm)
! (use mpi_f08; left out when built with -DGCOMM_NO_MPI_F08 for an MPI without it).
module gcomm
  use, intrinsic :: iso_c_binding
#ifndef GCOMM_NO_MPI_F08
  use mpi_f08, only: MPI_Comm
#endif
  implicit none
  private :: fortranString, commInitInteger
#ifndef GCOMM_NO_MPI_F08
  private :: commInitF08
#endif

  ! ---- Version (gcomm.h's GCOMM_MAJOR, GCOMM_MINOR, GCOMM_PATCH) ----
  integer(c_int), parameter :: GCOMM_MAJOR = 0
  integer(c_int), parameter :: GCOMM_MINOR = 1
  integer(c_int), parameter :: GCOMM_PATCH = 0
  integer(c_int), parameter :: GCOMM_VERSION_CODE = GCOMM_MAJOR*10000 + GCOMM_MINOR*100 + GCOMM_PATCH

  ! ---- gcommResult_t ----
  integer(c_int), parameter :: gcommSuccess = 0
  integer(c_int), parameter :: gcommInvalidArgument = 1
  integer(c_int), parameter :: gcommInvalidUsage = 2
  integer(c_int), parameter :: gcommSystemError = 3
  integer(c_int), parameter :: gcommInternalError = 4
  integer(c_int), parameter :: gcommDeviceError = 5
  integer(c_int), parameter :: gcommRemoteError = 6
  integer(c_int), parameter :: gcommTimeout = 7
  integer(c_int), parameter :: gcommAborted = 8
  integer(c_int), parameter :: gcommInProgress = 9
  integer(c_int), parameter :: gcommRevoked = 10

  ! ---- gcommDataType_t ----
  integer(c_int), parameter :: gcommInt8 = 0
  integer(c_int), parameter :: gcommChar = 0
  integer(c_int), parameter :: gcommUint8 = 1
  integer(c_int), parameter :: gcommInt32 = 2
  integer(c_int), parameter :: gcommInt = 2
  integer(c_int), parameter :: gcommUint32 = 3
  integer(c_int), parameter :: gcommInt64 = 4
  integer(c_int), parameter :: gcommUint64 = 5
  integer(c_int), parameter :: gcommFloat16 = 6
  integer(c_int), parameter :: gcommHalf = 6
  integer(c_int), parameter :: gcommFloat32 = 7
  integer(c_int), parameter :: gcommFloat = 7
  integer(c_int), parameter :: gcommFloat64 = 8
  integer(c_int), parameter :: gcommDouble = 8
  integer(c_int), parameter :: gcommBfloat16 = 9
  integer(c_int), parameter :: gcommFloat8e4m3 = 10
  integer(c_int), parameter :: gcommFloat8e5m2 = 11

  ! ---- gcommRedOp_t ----
  integer(c_int), parameter :: gcommSum = 0
  integer(c_int), parameter :: gcommProd = 1
  integer(c_int), parameter :: gcommMax = 2
  integer(c_int), parameter :: gcommMin = 3
  integer(c_int), parameter :: gcommAvg = 4

  ! ---- gcommScalarResidence_t (PreMulSum operators) ----
  integer(c_int), parameter :: gcommScalarDevice = 0
  integer(c_int), parameter :: gcommScalarHostImmediate = 1

  ! ---- Communicator options ----
  integer(c_int), parameter :: GCOMM_DEVICE_HOST = -1
  integer(c_int), parameter :: GCOMM_PROXY_THREAD = 0
  integer(c_int), parameter :: GCOMM_PROXY_POLL = 1
  integer(c_int), parameter :: GCOMM_SPLIT_NOCOLOR = -1
  integer(c_int), parameter :: GCOMM_CONFIG_UNDEF_INT = -huge(0_c_int) - 1_c_int
  integer(c_int), parameter :: GCOMM_CONFIG_MAGIC = int(z'67636f6d', c_int)

  ! gcommConfig_t; start from gcommConfigInitializer(). commName: c_null_ptr or c_loc of a
  ! character(kind=c_char) array ending in c_null_char (copied at init).
  type, bind(c) :: gcommConfig
    integer(c_size_t) :: size
    integer(c_int) :: magic
    integer(c_int) :: version
    integer(c_int) :: device
    integer(c_int) :: proxyMode
    type(c_ptr) :: commName
    integer(c_int) :: nChannels
  end type gcommConfig

  ! ---- Communicators: gcommCommInitMPI(comm, mpiComm, config) ----
  interface gcommCommInitMPI
    module procedure commInitInteger
#ifndef GCOMM_NO_MPI_F08
    module procedure commInitF08
#endif
  end interface gcommCommInitMPI

  interface
    ! ---- Library (the _c functions return the C string; the ones below convert it) ----
    integer(c_int) function gcommGetVersion(version) bind(c, name='gcommGetVersion')
      import :: c_int
      integer(c_int), intent(out) :: version
    end function gcommGetVersion

    type(c_ptr) function gcommGetErrorString_c(result) bind(c, name='gcommGetErrorString')
      import :: c_int, c_ptr
      integer(c_int), value :: result
    end function gcommGetErrorString_c

    type(c_ptr) function gcommGetLastError_c(comm) bind(c, name='gcommGetLastError')
      import :: c_ptr
      type(c_ptr), value :: comm
    end function gcommGetLastError_c

    ! ---- Communicators ----
    integer(c_int) function gcommCommInitMPIF(comm, fcomm, config) bind(c, name='gcommCommInitMPIF')
      import :: c_int, c_ptr
      type(c_ptr), intent(out) :: comm
      integer(c_int), value :: fcomm
      type(c_ptr), value :: config
    end function gcommCommInitMPIF

    integer(c_int) function gcommCommSplit(comm, color, key, newcomm, config) &
        bind(c, name='gcommCommSplit')
      import :: c_int, c_ptr
      type(c_ptr), value :: comm
      integer(c_int), value :: color, key
      type(c_ptr), intent(out) :: newcomm
      type(c_ptr), value :: config
    end function gcommCommSplit

    integer(c_int) function gcommCommDestroy(comm) bind(c, name='gcommCommDestroy')
      import :: c_int, c_ptr
      type(c_ptr), value :: comm
    end function gcommCommDestroy

    integer(c_int) function gcommRedOpCreatePreMulSum(op, scalar, datatype, residence, comm) &
        bind(c, name='gcommRedOpCreatePreMulSum')
      import :: c_int, c_ptr
      integer(c_int), intent(out) :: op
      type(c_ptr), value :: scalar
      integer(c_int), value :: datatype, residence
      type(c_ptr), value :: comm
    end function gcommRedOpCreatePreMulSum

    integer(c_int) function gcommRedOpDestroy(op, comm) bind(c, name='gcommRedOpDestroy')
      import :: c_int, c_ptr
      integer(c_int), value :: op
      type(c_ptr), value :: comm
    end function gcommRedOpDestroy

    integer(c_int) function gcommCommAbort(comm) bind(c, name='gcommCommAbort')
      import :: c_int, c_ptr
      type(c_ptr), value :: comm
    end function gcommCommAbort

    integer(c_int) function gcommCommGetAsyncError(comm, asyncError) &
        bind(c, name='gcommCommGetAsyncError')
      import :: c_int, c_ptr
      type(c_ptr), value :: comm
      integer(c_int), intent(out) :: asyncError
    end function gcommCommGetAsyncError

    integer(c_int) function gcommCommCount(comm, count) bind(c, name='gcommCommCount')
      import :: c_int, c_ptr
      type(c_ptr), value :: comm
      integer(c_int), intent(out) :: count
    end function gcommCommCount

    integer(c_int) function gcommCommUserRank(comm, rank) bind(c, name='gcommCommUserRank')
      import :: c_int, c_ptr
      type(c_ptr), value :: comm
      integer(c_int), intent(out) :: rank
    end function gcommCommUserRank

    integer(c_int) function gcommCommDevice(comm, device) bind(c, name='gcommCommDevice')
      import :: c_int, c_ptr
      type(c_ptr), value :: comm
      integer(c_int), intent(out) :: device
    end function gcommCommDevice

    ! ---- Collectives (in-place layouts as in gcomm.h) ----
    integer(c_int) function gcommAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream) &
        bind(c, name='gcommAllReduce')
      import :: c_int, c_ptr, c_size_t
      type(c_ptr), value :: sendbuff, recvbuff
      integer(c_size_t), value :: count
      integer(c_int), value :: datatype, op
      type(c_ptr), value :: comm, stream
    end function gcommAllReduce

    integer(c_int) function gcommBroadcast(sendbuff, recvbuff, count, datatype, root, comm, &
                                           stream) bind(c, name='gcommBroadcast')
      import :: c_int, c_ptr, c_size_t
      type(c_ptr), value :: sendbuff, recvbuff
      integer(c_size_t), value :: count
      integer(c_int), value :: datatype, root
      type(c_ptr), value :: comm, stream
    end function gcommBroadcast

    integer(c_int) function gcommReduce(sendbuff, recvbuff, count, datatype, op, root, comm, &
                                        stream) bind(c, name='gcommReduce')
      import :: c_int, c_ptr, c_size_t
      type(c_ptr), value :: sendbuff, recvbuff
      integer(c_size_t), value :: count
      integer(c_int), value :: datatype, op, root
      type(c_ptr), value :: comm, stream
    end function gcommReduce

    integer(c_int) function gcommAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream) &
        bind(c, name='gcommAllGather')
      import :: c_int, c_ptr, c_size_t
      type(c_ptr), value :: sendbuff, recvbuff
      integer(c_size_t), value :: sendcount
      integer(c_int), value :: datatype
      type(c_ptr), value :: comm, stream
    end function gcommAllGather

    integer(c_int) function gcommReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, &
                                               stream) bind(c, name='gcommReduceScatter')
      import :: c_int, c_ptr, c_size_t
      type(c_ptr), value :: sendbuff, recvbuff
      integer(c_size_t), value :: recvcount
      integer(c_int), value :: datatype, op
      type(c_ptr), value :: comm, stream
    end function gcommReduceScatter

    integer(c_int) function gcommAllToAll(sendbuff, recvbuff, count, datatype, comm, stream) &
        bind(c, name='gcommAllToAll')
      import :: c_int, c_ptr, c_size_t
      type(c_ptr), value :: sendbuff, recvbuff
      integer(c_size_t), value :: count
      integer(c_int), value :: datatype
      type(c_ptr), value :: comm, stream
    end function gcommAllToAll

    integer(c_int) function gcommGather(sendbuff, recvbuff, sendcount, datatype, root, comm, &
                                        stream) bind(c, name='gcommGather')
      import :: c_int, c_ptr, c_size_t
      type(c_ptr), value :: sendbuff, recvbuff
      integer(c_size_t), value :: sendcount
      integer(c_int), value :: datatype, root
      type(c_ptr), value :: comm, stream
    end function gcommGather

    integer(c_int) function gcommScatter(sendbuff, recvbuff, recvcount, datatype, root, comm, &
                                         stream) bind(c, name='gcommScatter')
      import :: c_int, c_ptr, c_size_t
      type(c_ptr), value :: sendbuff, recvbuff
      integer(c_size_t), value :: recvcount
      integer(c_int), value :: datatype, root
      type(c_ptr), value :: comm, stream
    end function gcommScatter

    ! ---- Vector collectives (counts and zero-based displacements in elements) ----
    integer(c_int) function gcommAllGatherV(sendbuff, sendcount, recvbuff, recvcounts, displs, &
                                            datatype, comm, stream) bind(c, name='gcommAllGatherV')
      import :: c_int, c_ptr, c_size_t
      type(c_ptr), value :: sendbuff
      integer(c_size_t), value :: sendcount
      type(c_ptr), value :: recvbuff
      integer(c_size_t), intent(in) :: recvcounts(*), displs(*)
      integer(c_int), value :: datatype
      type(c_ptr), value :: comm, stream
    end function gcommAllGatherV

    integer(c_int) function gcommAllToAllV(sendbuff, sendcounts, sdispls, recvbuff, recvcounts, &
                                           rdispls, datatype, comm, stream) &
        bind(c, name='gcommAllToAllV')
      import :: c_int, c_ptr, c_size_t
      type(c_ptr), value :: sendbuff
      integer(c_size_t), intent(in) :: sendcounts(*), sdispls(*)
      type(c_ptr), value :: recvbuff
      integer(c_size_t), intent(in) :: recvcounts(*), rdispls(*)
      integer(c_int), value :: datatype
      type(c_ptr), value :: comm, stream
    end function gcommAllToAllV

    ! recvcounts and displs are read on root only (pass any array elsewhere)
    integer(c_int) function gcommGatherV(sendbuff, sendcount, recvbuff, recvcounts, displs, &
                                         datatype, root, comm, stream) bind(c, name='gcommGatherV')
      import :: c_int, c_ptr, c_size_t
      type(c_ptr), value :: sendbuff
      integer(c_size_t), value :: sendcount
      type(c_ptr), value :: recvbuff
      integer(c_size_t), intent(in) :: recvcounts(*), displs(*)
      integer(c_int), value :: datatype, root
      type(c_ptr), value :: comm, stream
    end function gcommGatherV

    ! sendcounts and displs are read on root only (pass any array elsewhere)
    integer(c_int) function gcommScatterV(sendbuff, sendcounts, displs, recvbuff, recvcount, &
                                          datatype, root, comm, stream) bind(c, name='gcommScatterV')
      import :: c_int, c_ptr, c_size_t
      type(c_ptr), value :: sendbuff
      integer(c_size_t), intent(in) :: sendcounts(*), displs(*)
      type(c_ptr), value :: recvbuff
      integer(c_size_t), value :: recvcount
      integer(c_int), value :: datatype, root
      type(c_ptr), value :: comm, stream
    end function gcommScatterV

    ! ---- Point to point ----
    integer(c_int) function gcommSend(sendbuff, count, datatype, peer, comm, stream) &
        bind(c, name='gcommSend')
      import :: c_int, c_ptr, c_size_t
      type(c_ptr), value :: sendbuff
      integer(c_size_t), value :: count
      integer(c_int), value :: datatype, peer
      type(c_ptr), value :: comm, stream
    end function gcommSend

    integer(c_int) function gcommRecv(recvbuff, count, datatype, peer, comm, stream) &
        bind(c, name='gcommRecv')
      import :: c_int, c_ptr, c_size_t
      type(c_ptr), value :: recvbuff
      integer(c_size_t), value :: count
      integer(c_int), value :: datatype, peer
      type(c_ptr), value :: comm, stream
    end function gcommRecv

    ! ---- Groups ----
    integer(c_int) function gcommGroupStart() bind(c, name='gcommGroupStart')
      import :: c_int
    end function gcommGroupStart

    integer(c_int) function gcommGroupEnd() bind(c, name='gcommGroupEnd')
      import :: c_int
    end function gcommGroupEnd

    ! ---- Host memory the ranks of a node share (gcomm.h): call c_f_pointer(ptr, array, [n]) ----
    integer(c_int) function gcommHostAlloc(ptr, bytes) bind(c, name='gcommHostAlloc')
      import :: c_int, c_ptr, c_size_t
      type(c_ptr), intent(out) :: ptr
      integer(c_size_t), value :: bytes
    end function gcommHostAlloc

    integer(c_int) function gcommHostFree(ptr) bind(c, name='gcommHostFree')
      import :: c_int, c_ptr
      type(c_ptr), value :: ptr
    end function gcommHostFree

    ! ---- Progress and completion ----
    integer(c_int) function gcommProgress(comm) bind(c, name='gcommProgress')
      import :: c_int, c_ptr
      type(c_ptr), value :: comm
    end function gcommProgress

    integer(c_int) function gcommWait(comm, stream) bind(c, name='gcommWait')
      import :: c_int, c_ptr
      type(c_ptr), value :: comm, stream
    end function gcommWait

    integer(c_int) function gcommTest(comm, stream) bind(c, name='gcommTest')
      import :: c_int, c_ptr
      type(c_ptr), value :: comm, stream
    end function gcommTest
  end interface

contains

  ! A config with every field undefined (GCOMM_CONFIG_INITIALIZER).
  function gcommConfigInitializer() result(cfg)
    type(gcommConfig) :: cfg
    cfg%size = c_sizeof(cfg)
    cfg%magic = GCOMM_CONFIG_MAGIC
    cfg%version = GCOMM_VERSION_CODE
    cfg%device = GCOMM_CONFIG_UNDEF_INT
    cfg%proxyMode = GCOMM_CONFIG_UNDEF_INT
    cfg%commName = c_null_ptr
    cfg%nChannels = GCOMM_CONFIG_UNDEF_INT
  end function gcommConfigInitializer

  integer(c_int) function commInitInteger(comm, mpiComm, config) result(res)
    type(c_ptr), intent(out) :: comm
    integer, intent(in) :: mpiComm
    type(c_ptr), intent(in) :: config
    res = gcommCommInitMPIF(comm, int(mpiComm, c_int), config)
  end function commInitInteger

#ifndef GCOMM_NO_MPI_F08
  integer(c_int) function commInitF08(comm, mpiComm, config) result(res)
    type(c_ptr), intent(out) :: comm
    type(MPI_Comm), intent(in) :: mpiComm
    type(c_ptr), intent(in) :: config
    res = gcommCommInitMPIF(comm, int(mpiComm%MPI_VAL, c_int), config)
  end function commInitF08
#endif

  ! A C string (const char*) as a Fortran string.
  function fortranString(s) result(str)
    type(c_ptr), intent(in) :: s
    character(len=:), allocatable :: str
    character(kind=c_char), pointer :: chars(:)
    integer :: i, n
    call c_f_pointer(s, chars, [huge(0)]) ! read only up to the terminating NUL
    n = 0
    do while (chars(n + 1) /= c_null_char)
      n = n + 1
    end do
    allocate(character(len=n) :: str)
    do i = 1, n
      str(i:i) = chars(i)
    end do
  end function fortranString

  function gcommGetErrorString(result) result(str)
    integer(c_int), intent(in) :: result
    character(len=:), allocatable :: str
    str = fortranString(gcommGetErrorString_c(result))
  end function gcommGetErrorString

  ! The last error of this thread for comm (c_null_ptr: for no communicator).
  function gcommGetLastError(comm) result(str)
    type(c_ptr), intent(in) :: comm
    character(len=:), allocatable :: str
    str = fortranString(gcommGetLastError_c(comm))
  end function gcommGetLastError
end module gcomm
