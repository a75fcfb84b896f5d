! test_fortran.f90 - the Fortran module (use gcomm) end to end: both kinds of MPI communicator
! handle, a config, every collective and send/recv in a group on host arrays against MPI's own
! collectives on random data (odd sizes), split, errors, test/progress, abort. Prints PASS/FAIL
! lines on rank 0 (test/run.sh counts them).
program test_fortran
  use, intrinsic :: iso_c_binding
  use mpi_f08
  use mpi, only: MPI_COMM_WORLD_HANDLE => MPI_COMM_WORLD ! the integer handle of `use mpi`
  use gcomm
  implicit none
  integer, parameter :: n = 1237 ! elements per rank: odd, not a multiple of any chunk
  integer :: rank, nranks, seedSize
  integer, allocatable :: seed(:)
  type(c_ptr) :: comm, hostNull

  call MPI_Init()
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks)
  call random_seed(size=seedSize)
  allocate(seed(seedSize))
  seed = 12345 + 7919*rank
  call random_seed(put=seed)
  deallocate(seed)
  hostNull = c_null_ptr ! the stream of a host communicator

  call testVersionAndErrors()
  call testInitInteger()
  call check(gcommCommInitMPI(comm, MPI_COMM_WORLD, c_null_ptr), 'init from type(MPI_Comm)')
  call testAllReduce()
  call testPreMulSum()
  call testRooted()
  call testGatherLike()
  call testSendRecvGroup()
  call testHostAlloc()
  call testVector()
  call testSplitAndAbort()
  call testTestProgress()
  call check(gcommCommDestroy(comm), 'gcommCommDestroy')
  call MPI_Finalize()

contains

  ! Collective: rank 0 prints PASS what, or FAIL what when ok is false on any rank.
  subroutine report(what, ok)
    character(len=*), intent(in) :: what
    logical, intent(in) :: ok
    logical :: all
    call MPI_Allreduce(ok, all, 1, MPI_LOGICAL, MPI_LAND, MPI_COMM_WORLD)
    if (rank == 0) then
      if (all) then
        print '(a)', 'PASS fortran '//what
      else
        print '(a)', 'FAIL fortran '//what
      end if
    end if
  end subroutine report

  ! A call that must succeed: a FAIL line naming it and the error when it does not.
  subroutine check(res, what)
    integer(c_int), intent(in) :: res
    character(len=*), intent(in) :: what
    if (res /= gcommSuccess) then
      print '(a,i0,a)', 'FAIL fortran '//what//' on rank ', rank, ': '//gcommGetErrorString(res)// &
        ': '//gcommGetLastError(comm)
      call MPI_Abort(MPI_COMM_WORLD, 1)
    end if
  end subroutine check

  subroutine randomInts(a)
    integer(c_int32_t), intent(out) :: a(:)
    real :: r(size(a))
    call random_number(r)
    a = int(r*2000.0) - 1000
  end subroutine randomInts

  subroutine testVersionAndErrors()
    integer(c_int) :: version, res
    integer(c_int32_t), target :: x(4)
    call check(gcommGetVersion(version), 'gcommGetVersion')
    call report('gcommGetVersion is GCOMM_VERSION_CODE', version == GCOMM_VERSION_CODE)
    call report('gcommGetErrorString names the error', &
                index(gcommGetErrorString(gcommInvalidArgument), 'argument') > 0)
    x = 0
    res = gcommAllReduce(c_loc(x), c_loc(x), 4_c_size_t, gcommInt32, gcommSum, c_null_ptr, hostNull)
    call report('a NULL communicator is gcommInvalidArgument, with a message', &
                res == gcommInvalidArgument .and. len(gcommGetLastError(c_null_ptr)) > 0)
  end subroutine testVersionAndErrors

  ! The integer handle of `use mpi`, a config (poll mode, a name), the queries.
  subroutine testInitInteger()
    type(gcommConfig), target :: cfg
    character(kind=c_char), target :: name(8) = ['f', 'o', 'r', 't', 'r', 'a', 'n', c_null_char]
    type(c_ptr) :: c
    integer(c_int) :: count, me, device, async
    cfg = gcommConfigInitializer()
    cfg%proxyMode = GCOMM_PROXY_POLL
    cfg%commName = c_loc(name)
    call check(gcommCommInitMPI(c, MPI_COMM_WORLD_HANDLE, c_loc(cfg)), 'init from integer')
    call check(gcommCommCount(c, count), 'gcommCommCount')
    call check(gcommCommUserRank(c, me), 'gcommCommUserRank')
    call check(gcommCommDevice(c, device), 'gcommCommDevice')
    call check(gcommCommGetAsyncError(c, async), 'gcommCommGetAsyncError')
    call report('init from an integer handle with a config: count, rank, device, no error', &
                count == nranks .and. me == rank .and. device == GCOMM_DEVICE_HOST .and. &
                async == gcommSuccess)
    call check(gcommCommDestroy(c), 'gcommCommDestroy')
    cfg%nChannels = 0
    call report('a bad config is gcommInvalidArgument', &
                gcommCommInitMPI(c, MPI_COMM_WORLD_HANDLE, c_loc(cfg)) == gcommInvalidArgument)
  end subroutine testInitInteger

  subroutine testAllReduce()
    integer(c_int32_t), target :: a(n), got(n), want(n)
    real(c_double), target :: d(n), dgot(n), dwant(n)
    integer(c_int) :: res
    call randomInts(a)
    call check(gcommAllReduce(c_loc(a), c_loc(got), int(n, c_size_t), gcommInt32, gcommSum, comm, &
                              hostNull), 'gcommAllReduce')
    call check(gcommWait(comm, hostNull), 'gcommWait')
    call MPI_Allreduce(a, want, n, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD)
    call report('AllReduce int32 sum = MPI_Allreduce', all(got == want))
    call random_number(d)
    dgot = d
    call check(gcommAllReduce(c_loc(dgot), c_loc(dgot), int(n, c_size_t), gcommFloat64, gcommMax, &
                              comm, hostNull), 'gcommAllReduce in place')
    call check(gcommWait(comm, hostNull), 'gcommWait')
    call MPI_Allreduce(d, dwant, n, MPI_DOUBLE_PRECISION, MPI_MAX, MPI_COMM_WORLD)
    call report('AllReduce float64 max in place = MPI_Allreduce', all(dgot == dwant))
    res = gcommAllReduce(c_loc(a), c_loc(got), int(n, c_size_t), 99_c_int, gcommSum, comm, hostNull)
    call report('a bad datatype is gcommInvalidArgument, naming the datatype', &
                res == gcommInvalidArgument .and. index(gcommGetLastError(comm), 'datatype') > 0)
  end subroutine testAllReduce

  ! A PreMulSum operator with a host scalar (rank + 1) on int32: sum of (rank + 1) * a, against
  ! MPI_Allreduce of the products computed here.
  subroutine testPreMulSum()
    integer(c_int32_t), target :: a(n), got(n), want(n), scalar
    integer(c_int) :: op
    call randomInts(a)
    scalar = rank + 1
    call check(gcommRedOpCreatePreMulSum(op, c_loc(scalar), gcommInt32, gcommScalarHostImmediate, &
                                         comm), 'gcommRedOpCreatePreMulSum')
    call check(gcommAllReduce(c_loc(a), c_loc(got), int(n, c_size_t), gcommInt32, op, comm, &
                              hostNull), 'gcommAllReduce PreMulSum')
    call check(gcommWait(comm, hostNull), 'gcommWait')
    call check(gcommRedOpDestroy(op, comm), 'gcommRedOpDestroy')
    call MPI_Allreduce(a * scalar, want, n, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD)
    call report('AllReduce int32 PreMulSum (host scalar) = MPI_Allreduce of the products', &
                all(got == want))
  end subroutine testPreMulSum

  ! Broadcast from the last rank, Reduce to rank 0 (int64 sum).
  subroutine testRooted()
    integer(c_int32_t), target :: a(n), want(n)
    integer(c_int64_t), target :: b(n), bsum(n), bwant(n)
    integer :: root
    root = nranks - 1
    call randomInts(a)
    want = a
    call MPI_Bcast(want, n, MPI_INTEGER, root, MPI_COMM_WORLD)
    call check(gcommBroadcast(c_loc(a), c_loc(a), int(n, c_size_t), gcommInt32, root, comm, &
                              hostNull), 'gcommBroadcast')
    call check(gcommWait(comm, hostNull), 'gcommWait')
    call report('Broadcast from the last rank = MPI_Bcast', all(a == want))
    call randomInts(a)
    b = int(a, c_int64_t)*100000_c_int64_t
    bsum = -1
    call check(gcommReduce(c_loc(b), c_loc(bsum), int(n, c_size_t), gcommInt64, gcommSum, 0, comm, &
                           hostNull), 'gcommReduce')
    call check(gcommWait(comm, hostNull), 'gcommWait')
    call MPI_Reduce(b, bwant, n, MPI_INTEGER8, MPI_SUM, 0, MPI_COMM_WORLD)
    call report('Reduce int64 sum to rank 0 = MPI_Reduce', rank /= 0 .or. all(bsum == bwant))
  end subroutine testRooted

  ! AllGather (out of place and in place), ReduceScatter, AllToAll, Gather, Scatter.
  subroutine testGatherLike()
    integer(c_int32_t), target :: a(n), blocks(n*nranks), got(n*nranks), want(n*nranks)
    integer(c_size_t) :: cn
    integer :: root
    cn = int(n, c_size_t)
    root = nranks/2
    call randomInts(a)
    call check(gcommAllGather(c_loc(a), c_loc(got), cn, gcommInt32, comm, hostNull), 'AllGather')
    call check(gcommWait(comm, hostNull), 'gcommWait')
    call MPI_Allgather(a, n, MPI_INTEGER, want, n, MPI_INTEGER, MPI_COMM_WORLD)
    call report('AllGather = MPI_Allgather', all(got == want))
    got = -7
    got(rank*n + 1:rank*n + n) = a
    call check(gcommAllGather(c_loc(got(rank*n + 1)), c_loc(got), cn, gcommInt32, comm, hostNull), &
               'AllGather in place')
    call check(gcommWait(comm, hostNull), 'gcommWait')
    call report('AllGather in place = MPI_Allgather', all(got == want))

    call randomInts(blocks)
    call check(gcommReduceScatter(c_loc(blocks), c_loc(a), cn, gcommInt32, gcommSum, comm, &
                                  hostNull), 'ReduceScatter')
    call check(gcommWait(comm, hostNull), 'gcommWait')
    call MPI_Reduce_scatter_block(blocks, want, n, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD)
    call report('ReduceScatter int32 sum = MPI_Reduce_scatter_block', all(a == want(1:n)))

    call check(gcommAllToAll(c_loc(blocks), c_loc(got), cn, gcommInt32, comm, hostNull), 'AllToAll')
    call check(gcommWait(comm, hostNull), 'gcommWait')
    call MPI_Alltoall(blocks, n, MPI_INTEGER, want, n, MPI_INTEGER, MPI_COMM_WORLD)
    call report('AllToAll = MPI_Alltoall', all(got == want))

    call randomInts(a)
    got = -7
    call check(gcommGather(c_loc(a), c_loc(got), cn, gcommInt32, root, comm, hostNull), 'Gather')
    call check(gcommWait(comm, hostNull), 'gcommWait')
    call MPI_Gather(a, n, MPI_INTEGER, want, n, MPI_INTEGER, root, MPI_COMM_WORLD)
    call report('Gather to the middle rank = MPI_Gather', rank /= root .or. all(got == want))

    a = -7
    call check(gcommScatter(c_loc(blocks), c_loc(a), cn, gcommInt32, root, comm, hostNull), &
               'Scatter')
    call check(gcommWait(comm, hostNull), 'gcommWait')
    call MPI_Scatter(blocks, n, MPI_INTEGER, want, n, MPI_INTEGER, root, MPI_COMM_WORLD)
    call report('Scatter from the middle rank = MPI_Scatter', all(a == want(1:n)))
  end subroutine testGatherLike

  ! The vector collectives against MPI's, with counts 0..4 (zeros included) that differ by pair.
  subroutine testVector()
    integer, parameter :: m = 4*64
    integer(c_int32_t), target :: a(m), got(m*64), want(m*64)
    integer(c_size_t) :: sc(0:nranks - 1), sd(0:nranks - 1), rc(0:nranks - 1), rd(0:nranks - 1)
    integer :: isc(0:nranks - 1), isd(0:nranks - 1), irc(0:nranks - 1), ird(0:nranks - 1), p, root
    root = nranks - 1
    do p = 0, nranks - 1 ! rank i sends rank j mod(3*i + 5*j + 1, 5) elements
      isc(p) = modulo(3*rank + 5*p + 1, 5)
      irc(p) = modulo(3*p + 5*rank + 1, 5)
    end do
    isd(0) = 0
    ird(0) = 0
    do p = 1, nranks - 1
      isd(p) = isd(p - 1) + isc(p - 1)
      ird(p) = ird(p - 1) + irc(p - 1) + 1 ! a gap of one element between blocks
    end do
    sc = isc
    sd = isd
    rc = irc
    rd = ird
    call randomInts(a)
    got = -7
    want = -7
    call check(gcommAllToAllV(c_loc(a), sc, sd, c_loc(got), rc, rd, gcommInt32, comm, hostNull), &
               'gcommAllToAllV')
    call check(gcommWait(comm, hostNull), 'gcommWait')
    call MPI_Alltoallv(a, isc, isd, MPI_INTEGER, want, irc, ird, MPI_INTEGER, MPI_COMM_WORLD)
    call report('AllToAllV = MPI_Alltoallv', all(got == want))

    ! every rank's block is what it sends rank 0 in the AllToAllV above: rc/rd of rank 0's view
    do p = 0, nranks - 1
      irc(p) = modulo(3*p + 1, 5)
    end do
    do p = 1, nranks - 1
      ird(p) = ird(p - 1) + irc(p - 1) + 1
    end do
    rc = irc
    rd = ird
    got = -7
    want = -7
    call check(gcommAllGatherV(c_loc(a), rc(rank), c_loc(got), rc, rd, gcommInt32, comm, &
                               hostNull), 'gcommAllGatherV')
    call check(gcommWait(comm, hostNull), 'gcommWait')
    call MPI_Allgatherv(a, irc(rank), MPI_INTEGER, want, irc, ird, MPI_INTEGER, MPI_COMM_WORLD)
    call report('AllGatherV = MPI_Allgatherv', all(got == want))

    got = -7
    want = -7
    call check(gcommGatherV(c_loc(a), rc(rank), c_loc(got), rc, rd, gcommInt32, root, comm, &
                            hostNull), 'gcommGatherV')
    call check(gcommWait(comm, hostNull), 'gcommWait')
    call MPI_Gatherv(a, irc(rank), MPI_INTEGER, want, irc, ird, MPI_INTEGER, root, MPI_COMM_WORLD)
    call report('GatherV to the last rank = MPI_Gatherv', rank /= root .or. all(got == want))

    call randomInts(got)
    a = -7
    want = -7
    call check(gcommScatterV(c_loc(got), rc, rd, c_loc(a), rc(rank), gcommInt32, root, comm, &
                             hostNull), 'gcommScatterV')
    call check(gcommWait(comm, hostNull), 'gcommWait')
    call MPI_Scatterv(got, irc, ird, MPI_INTEGER, want, irc(rank), MPI_INTEGER, root, &
                      MPI_COMM_WORLD)
    call report('ScatterV from the last rank = MPI_Scatterv', all(a == want(1:m)))
  end subroutine testVector

  ! Each rank sends to both neighbours and receives from both, in one group, receives first.
  subroutine testSendRecvGroup()
    integer(c_int32_t), target :: a(n), fromLeft(n), fromRight(n), wantL(n), wantR(n)
    integer :: left, right
    left = modulo(rank - 1, nranks)
    right = modulo(rank + 1, nranks)
    call randomInts(a)
    call check(gcommGroupStart(), 'gcommGroupStart')
    call check(gcommRecv(c_loc(fromLeft), int(n, c_size_t), gcommInt32, left, comm, hostNull), &
               'gcommRecv')
    call check(gcommRecv(c_loc(fromRight), int(n, c_size_t), gcommInt32, right, comm, hostNull), &
               'gcommRecv')
    call check(gcommSend(c_loc(a), int(n, c_size_t), gcommInt32, right, comm, hostNull), 'gcommSend')
    call check(gcommSend(c_loc(a), int(n, c_size_t), gcommInt32, left, comm, hostNull), 'gcommSend')
    call check(gcommGroupEnd(), 'gcommGroupEnd')
    call check(gcommWait(comm, hostNull), 'gcommWait')
    call MPI_Sendrecv(a, n, MPI_INTEGER, right, 1, wantL, n, MPI_INTEGER, left, 1, MPI_COMM_WORLD, &
                      MPI_STATUS_IGNORE)
    call MPI_Sendrecv(a, n, MPI_INTEGER, left, 2, wantR, n, MPI_INTEGER, right, 2, MPI_COMM_WORLD, &
                      MPI_STATUS_IGNORE)
    call report('Send/Recv to both neighbours in a group = MPI_Sendrecv', &
                all(fromLeft == wantL) .and. all(fromRight == wantR))
  end subroutine testSendRecvGroup

  ! A Fortran array over a buffer of gcommHostAlloc: sent to the right neighbour (steps that the
  ! receiver reads where the buffer lies), then freed.
  subroutine testHostAlloc()
    integer, parameter :: m = 70001 ! 280 KB: steps past the smallest lent
    type(c_ptr) :: p, q
    integer(c_int32_t), pointer :: a(:), got(:)
    integer(c_int32_t), allocatable :: want(:)
    integer :: left, right
    left = modulo(rank - 1, nranks)
    right = modulo(rank + 1, nranks)
    call check(gcommHostAlloc(p, int(4*m, c_size_t)), 'gcommHostAlloc')
    call check(gcommHostAlloc(q, int(4*m, c_size_t)), 'gcommHostAlloc')
    call c_f_pointer(p, a, [m])
    call c_f_pointer(q, got, [m])
    allocate(want(m))
    call randomInts(a)
    got = -1
    call check(gcommGroupStart(), 'gcommGroupStart')
    call check(gcommSend(p, int(m, c_size_t), gcommInt32, right, comm, hostNull), 'gcommSend')
    call check(gcommRecv(q, int(m, c_size_t), gcommInt32, left, comm, hostNull), 'gcommRecv')
    call check(gcommGroupEnd(), 'gcommGroupEnd')
    call check(gcommWait(comm, hostNull), 'gcommWait')
    call MPI_Sendrecv(a, m, MPI_INTEGER, right, 3, want, m, MPI_INTEGER, left, 3, MPI_COMM_WORLD, &
                      MPI_STATUS_IGNORE)
    call report('Send/Recv of arrays over gcommHostAlloc = MPI_Sendrecv', all(got == want))
    deallocate(want)
    call check(gcommHostFree(p), 'gcommHostFree')
    call check(gcommHostFree(q), 'gcommHostFree')
  end subroutine testHostAlloc

  ! Even and odd ranks split; an AllReduce in each; then an abort stops the split communicator.
  subroutine testSplitAndAbort()
    type(c_ptr) :: half
    integer(c_int32_t), target :: one(1)
    integer(c_int) :: count, async, res
    integer :: expected
    call check(gcommCommSplit(comm, modulo(rank, 2), rank, half, c_null_ptr), 'gcommCommSplit')
    call check(gcommCommCount(half, count), 'gcommCommCount')
    one = 1
    call check(gcommAllReduce(c_loc(one), c_loc(one), 1_c_size_t, gcommInt32, gcommSum, half, &
                              hostNull), 'gcommAllReduce on the split')
    call check(gcommWait(half, hostNull), 'gcommWait')
    expected = (nranks + 1 - modulo(rank, 2))/2
    call report('CommSplit by parity: sizes and an AllReduce in each', &
                count == expected .and. one(1) == expected)
    call check(gcommCommAbort(half), 'gcommCommAbort')
    call check(gcommCommGetAsyncError(half, async), 'gcommCommGetAsyncError')
    res = gcommWait(half, hostNull)
    call report('CommAbort: the async error and later waits are gcommAborted', &
                async == gcommAborted .and. res == gcommAborted)
    call check(gcommCommDestroy(half), 'gcommCommDestroy after abort')
    call check(gcommCommSplit(comm, GCOMM_SPLIT_NOCOLOR, 0, half, c_null_ptr), 'split, no color')
    call report('CommSplit with GCOMM_SPLIT_NOCOLOR gives c_null_ptr', .not. c_associated(half))
  end subroutine testSplitAndAbort

  ! gcommTest until done, driving progress; then it stays done.
  subroutine testTestProgress()
    integer(c_int32_t), target :: a(n), want(n)
    integer(c_int) :: res
    call randomInts(a)
    call MPI_Allreduce(a, want, n, MPI_INTEGER, MPI_MIN, MPI_COMM_WORLD)
    call check(gcommAllReduce(c_loc(a), c_loc(a), int(n, c_size_t), gcommInt32, gcommMin, comm, &
                              hostNull), 'gcommAllReduce')
    res = gcommInProgress
    do while (res == gcommInProgress)
      call check(gcommProgress(comm), 'gcommProgress')
      res = gcommTest(comm, hostNull)
    end do
    call report('gcommTest/gcommProgress until complete: AllReduce min = MPI_Allreduce', &
                res == gcommSuccess .and. all(a == want))
  end subroutine testTestProgress
end program test_fortran
